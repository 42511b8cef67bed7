"""BackupAndRestore on 2 workers x 2 logical CPUs, started by `keras-scaling launch`.

One job never stopped; one job in which worker 1 sends itself SIGTERM after
optimizer step 30 (TensorFlow's coordinated preemption handling brings both
workers to the same later step; both exit with status 75); the same command again,
which resumes. The weights at the end must be bitwise equal, although in the
stopped and resumed jobs the chief alone reads a batch before training.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from test_multi_worker_training import (  # noqa: E402
    details,
    kill_recorded_workers,
    run_command,
    worker_env,
)

WORKER = os.path.join(REPO, "tests", "workers", "backup_worker.py")
LAUNCH_TIMEOUT_S = 240
EXIT_PREEMPTED = 75

pytestmark = pytest.mark.timeout(3 * LAUNCH_TIMEOUT_S + 60)


def launch(tmp_path, name, *extra, backup="backup"):
    out = tmp_path / f"{name}.npz"
    command = [
        sys.executable,
        "-m",
        "keras_scaling",
        "launch",
        "--workers",
        "2",
        "--cpu-devices",
        "2",
        "--grace-period",
        "20",
        "--",
        sys.executable,
        WORKER,
        "--backup-dir",
        str(tmp_path / backup),
        "--out",
        str(out),
        "--pid-dir",
        str(tmp_path / "pids"),
        *extra,
    ]
    try:
        return run_command(command, timeout_s=LAUNCH_TIMEOUT_S), out
    finally:
        kill_recorded_workers(str(tmp_path / "pids"))


def arrays(path):
    with np.load(path) as loaded:
        return [loaded[name] for name in loaded.files]


def test_sigterm_to_one_worker_then_resume_is_bitwise_identical_to_a_job_never_stopped(tmp_path):
    (code, out, err), reference = launch(tmp_path, "reference", backup="reference_backup")
    assert code == 0, details(code, out, err)

    # The chief alone reads a batch before fit, in both runs: no worker's share changes.
    (code, out, err), _ = launch(
        tmp_path, "resumed", "--sigterm-at", "30", "--sigterm-worker", "1", "--chief-peeks"
    )
    assert code == EXIT_PREEMPTED, details(code, out, err)
    # Both workers stop after the same step, the one TensorFlow agreed on.
    chief_steps = re.findall(
        r"\[worker 0\] Preemption notice \(SIGTERM\): saved a backup at optimizer step (\d+)", err
    )
    other_steps = re.findall(
        r"\[worker 1\] Preemption notice \(SIGTERM\): the chief saved a backup at "
        r"optimizer step (\d+)",
        err,
    )
    assert len(chief_steps) == 1 and chief_steps == other_steps, details(code, out, err)
    assert int(chief_steps[0]) > 30
    # Only the chief's backup is kept; the other worker's scratch space is gone.
    kept = sorted(
        os.path.relpath(os.path.join(root, name), tmp_path / "backup")
        for root, _, names in os.walk(tmp_path / "backup")
        for name in names
    )
    assert kept == ["backup.npz"]

    (code, out, err), resumed = launch(tmp_path, "resumed", "--chief-peeks")
    assert code == 0, details(code, out, err)
    for worker in range(2):
        assert err.count(f"[worker {worker}] BackupAndRestore: resuming from") == 1, err[-4000:]

    with open(f"{resumed}.json") as file, open(f"{reference}.json") as reference_file:
        resumed_result, reference_result = json.load(file), json.load(reference_file)
    assert resumed_result["iterations"] == reference_result["iterations"] == 60
    assert resumed_result["start_iterations"] == int(chief_steps[0])
    for index, (value, expected) in enumerate(zip(arrays(resumed), arrays(reference))):
        assert value.tobytes() == expected.tobytes(), f"variable {index} differs"


def test_sigterm_to_launch_makes_the_workers_save_and_the_same_command_resumes(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    command = [
        sys.executable,
        "-m",
        "keras_scaling",
        "launch",
        "--workers",
        "2",
        "--cpu-devices",
        "2",
        "--grace-period",
        "60",
        "--",
        sys.executable,
        WORKER,
        "--backup-dir",
        str(tmp_path / "backup"),
        "--out",
        str(tmp_path / "out.npz"),
        "--pid-dir",
        str(tmp_path / "pids"),
    ]
    process = subprocess.Popen(
        command + ["--mark-dir", str(marks), "--sleep-per-step", "0.2"],
        cwd=REPO,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while len(os.listdir(marks)) < 2:
            assert process.poll() is None, process.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=LAUNCH_TIMEOUT_S)
    finally:
        process.kill()
        process.wait()
        kill_recorded_workers(str(tmp_path / "pids"))
    assert process.returncode == EXIT_PREEMPTED, details(process.returncode, out, err)
    assert "every worker saved a backup and exited with status 75" in err

    code, out, err = run_command(command, timeout_s=LAUNCH_TIMEOUT_S)
    kill_recorded_workers(str(tmp_path / "pids"))
    assert code == 0, details(code, out, err)
    with open(tmp_path / "out.npz.json") as file:
        result = json.load(file)
    assert result["start_iterations"] > 5  # restored, not trained afresh
    # 640 samples, global batch 32: 20 steps per epoch, 3 epochs.
    assert result["iterations"] == 60
