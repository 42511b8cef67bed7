"""Helpers of the Slurm tests: the job's environment and batch scripts."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MULTI_WORKER_TESTS = os.path.join(REPO, "tests", "multi_worker")


def job_env(**extra):
    """What the tasks get: this venv first on PATH, TensorFlow quiet."""
    env = {
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        "PYTHON": sys.executable,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONUNBUFFERED": "1",
        "KERAS_SCALING_CPU_DEVICES": "",
    }
    env.update(extra)
    return env


def write_script(path, body):
    """A batch script `path` with `body` after the shebang; returns the path."""
    with open(path, "w") as file:
        file.write("#!/bin/bash\n" + body)
    os.chmod(path, 0o755)
    return str(path)


def read(path):
    try:
        with open(path, errors="replace") as file:
            return file.read()
    except FileNotFoundError:
        return ""
