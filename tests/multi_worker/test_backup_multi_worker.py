"""BackupAndRestore on 2 workers x 2 logical CPUs, started by `keras-scaling launch`.

One job never stopped; one job in which worker 1 sends itself SIGTERM after
optimizer step 30 (TensorFlow's coordinated preemption handling brings both
workers to the same later step; both exit with status 75); the same command again,
which resumes. The weights at the end must be bitwise equal.
"""

import os
import re
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from test_multi_worker_training import details, kill_recorded_workers, run_command  # noqa: E402

WORKER = os.path.join(REPO, "tests", "workers", "backup_worker.py")
LAUNCH_TIMEOUT_S = 240
EXIT_PREEMPTED = 75

pytestmark = pytest.mark.timeout(3 * LAUNCH_TIMEOUT_S + 60)


def launch(tmp_path, name, *extra, backup="backup"):
    out = tmp_path / f"{name}.npz"
    command = [
        sys.executable, "-m", "keras_scaling", "launch", "--workers", "2",
        "--cpu-devices", "2", "--grace-period", "20", "--",
        sys.executable, WORKER, "--backup-dir", str(tmp_path / backup),
        "--out", str(out), "--pid-dir", str(tmp_path / "pids"), *extra,
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

    (code, out, err), _ = launch(
        tmp_path, "resumed", "--sigterm-at", "30", "--sigterm-worker", "1"
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

    (code, out, err), resumed = launch(tmp_path, "resumed")
    assert code == 0, details(code, out, err)

    assert open(f"{resumed}.json").read() == open(f"{reference}.json").read()
    for index, (value, expected) in enumerate(zip(arrays(resumed), arrays(reference))):
        assert value.tobytes() == expected.tobytes(), f"variable {index} differs"
