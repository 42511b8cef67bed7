"""`keras-scaling doctor` run as a command, in processes of its own, for the doctor tests."""

import os
import re
import socket
import subprocess
import sys

TIMEOUT_S = 300


def clean_env(**extra):
    """The environment of a doctor run: no TF_CONFIG or logical CPUs of this process, plus `extra`."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    env.pop("KERAS_SCALING_CPU_DEVICES", None)
    env.update(extra)
    return env


def run(args, tmp_path, env=None):
    """Runs `args` in `tmp_path` to its end (at most `TIMEOUT_S`), its output captured as text."""
    return subprocess.run(
        args,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env or clean_env(),
    )


def doctor(*args):
    """The command line of `keras-scaling doctor` with a small all-reduce, plus `args`."""
    return [
        sys.executable,
        "-m",
        "keras_scaling",
        "doctor",
        "--size-mb",
        "1",
        "--rounds",
        "1",
        *args,
    ]


def launch(*command, workers=2):
    """The command line of `keras-scaling launch` running `command` on `workers` local workers."""
    return [
        sys.executable,
        "-m",
        "keras_scaling",
        "launch",
        "--workers",
        str(workers),
        "--",
        *command,
    ]


def check_lines(output):
    """{check name: "ok"/"FAIL"} of the check lines in `output`."""
    found = {}
    for status, name in re.findall(r"^(?:\[worker \d\] )?(ok|FAIL) +([a-z -]+):", output, re.M):
        found[name] = status
    return found


def free_port():
    """A TCP port on 127.0.0.1 free now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
