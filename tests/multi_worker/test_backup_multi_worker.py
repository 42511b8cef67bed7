"""BackupAndRestore on 2 workers x 2 logical CPUs, started by `keras-scaling launch`.

One job is stopped twice and resumed twice, the same command each time but
for how it is stopped: first SIGTERM to `launch` itself, which passes it to
the workers; then worker 1 sends itself SIGTERM after optimizer step
`SIGTERM_AT` (TensorFlow's coordinated preemption handling brings both
workers to the same later step); both times both workers save and exit with
status 75. The third launch resumes to the end, then trains a job never
stopped from the same seed in the same processes (`--then`: starting
TensorFlow costs seconds of CPU time). The weights at the end must be
bitwise equal, although in the stopped and resumed job the chief alone reads
a batch before training.
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
# 640 samples, global batch 32: 20 steps per epoch, 3 epochs.
TOTAL_STEPS = 60
# The job stopped through `launch` saves a few steps after step 5 (the
# worker's sleep of SLEEP_PER_STEP_S after each step leaves the signal
# time to arrive), well before worker 1 signals itself.
SIGTERM_AT = 40
SLEEP_PER_STEP_S = 0.4

# The fixture's three launches, the last training twice, each training within LAUNCH_TIMEOUT_S.
pytestmark = pytest.mark.timeout(4 * LAUNCH_TIMEOUT_S + 60)


def launch_command(tmp_path, name, *extra, grace_period_s=20):
    """`keras-scaling launch` of the worker writing `tmp_path/name.npz`; `extra` follow."""
    return [
        sys.executable,
        "-m",
        "keras_scaling",
        "launch",
        "--workers",
        "2",
        "--cpu-devices",
        "2",
        "--grace-period",
        str(grace_period_s),
        "--",
        sys.executable,
        WORKER,
        "--pid-dir",
        str(tmp_path / "pids"),
        *worker_args(tmp_path, name),
        *extra,
    ]


def worker_args(tmp_path, name, backup="backup"):
    return ["--backup-dir", str(tmp_path / backup), "--out", str(tmp_path / f"{name}.npz")]


def sigterm_to_launch(command, marks):
    """Runs `command`, sends `launch` SIGTERM once both workers marked step 5; (code, out, err)."""
    process = subprocess.Popen(
        command,
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
    return process.returncode, out, err


def saved_steps(err, worker):
    """The optimizer steps at which `worker` said it saved (or the chief saved) a backup."""
    who = "saved" if worker == 0 else "the chief saved"
    pattern = rf"\[worker {worker}\] Preemption notice \(SIGTERM\): {who} a backup at "
    return [int(step) for step in re.findall(pattern + r"optimizer step (\d+)", err)]


def resumed_from(err, worker):
    """The optimizer steps of the backups `worker` said it resumed from."""
    pattern = rf"\[worker {worker}\] BackupAndRestore: resuming from .*? \(saved at optimizer "
    return [int(step) for step in re.findall(pattern + r"step (\d+)\)", err)]


@pytest.fixture(scope="module")
def stopped_twice_then_resumed(tmp_path_factory):
    """`{"by_launch", "by_worker", "resumed"}`: each launch's (code, out, err), in turn.

    Also `kept`, the files left in `backup_dir` after the second stop, and
    the paths `resumed` and `reference` of the weights written by the last
    launch (`.json` beside them: its step counts).
    """
    tmp_path = tmp_path_factory.mktemp("backup_multi_worker")
    marks = tmp_path / "marks"
    marks.mkdir()
    runs = {}
    try:
        runs["by_launch"] = sigterm_to_launch(
            launch_command(
                tmp_path,
                "resumed",
                "--chief-peeks",
                "--mark-dir",
                str(marks),
                "--sleep-per-step",
                str(SLEEP_PER_STEP_S),
                grace_period_s=60,
            ),
            marks,
        )
        assert runs["by_launch"][0] == EXIT_PREEMPTED, details(*runs["by_launch"])
        kill_recorded_workers(str(tmp_path / "pids"))

        runs["by_worker"] = run_command(
            launch_command(
                tmp_path,
                "resumed",
                "--chief-peeks",
                "--sigterm-at",
                str(SIGTERM_AT),
                "--sigterm-worker",
                "1",
            ),
            timeout_s=LAUNCH_TIMEOUT_S,
        )
        assert runs["by_worker"][0] == EXIT_PREEMPTED, details(*runs["by_worker"])
        kill_recorded_workers(str(tmp_path / "pids"))
        runs["kept"] = sorted(
            os.path.relpath(os.path.join(root, name), tmp_path / "backup")
            for root, _, names in os.walk(tmp_path / "backup")
            for name in names
        )

        # The job never stopped trains after the resumed one, in a backup_dir of its own.
        runs["resumed"] = run_command(
            launch_command(
                tmp_path,
                "resumed",
                "--chief-peeks",
                "--then",
                *worker_args(tmp_path, "reference", backup="reference_backup"),
            ),
            timeout_s=2 * LAUNCH_TIMEOUT_S,
        )
    finally:
        kill_recorded_workers(str(tmp_path / "pids"))
    runs["resumed_out"] = tmp_path / "resumed.npz"
    runs["reference_out"] = tmp_path / "reference.npz"
    return runs


def arrays(path):
    with np.load(path) as loaded:
        return [loaded[name] for name in loaded.files]


def test_sigterm_to_launch_makes_the_workers_save_and_exit_75(stopped_twice_then_resumed):
    code, out, err = stopped_twice_then_resumed["by_launch"]

    assert code == EXIT_PREEMPTED, details(code, out, err)
    assert "every worker saved a backup and exited with status 75" in err
    # Both workers saved after the step the test waited for, before finishing.
    steps = saved_steps(err, 0)
    assert len(steps) == 1 and saved_steps(err, 1) == steps, details(code, out, err)
    assert 5 <= steps[0] < SIGTERM_AT


def test_the_same_command_resumes_after_a_sigterm_to_launch(stopped_twice_then_resumed):
    _, _, stopped_err = stopped_twice_then_resumed["by_launch"]
    code, out, err = stopped_twice_then_resumed["by_worker"]

    # Restored, not trained afresh: both workers start from the step saved.
    (saved,) = saved_steps(stopped_err, 0)
    assert saved >= 5
    assert resumed_from(err, 0) == resumed_from(err, 1) == [saved], details(code, out, err)


def test_sigterm_to_one_worker_makes_both_save_after_the_same_step(stopped_twice_then_resumed):
    code, out, err = stopped_twice_then_resumed["by_worker"]

    assert code == EXIT_PREEMPTED, details(code, out, err)
    # Both workers stop after the same step, the one TensorFlow agreed on.
    chief_steps = saved_steps(err, 0)
    assert len(chief_steps) == 1 and chief_steps == saved_steps(err, 1), details(code, out, err)
    assert chief_steps[0] > SIGTERM_AT
    # Only the chief's backup is kept; the other worker's scratch space is gone.
    assert stopped_twice_then_resumed["kept"] == ["backup.npz"]


def test_resuming_twice_is_bitwise_identical_to_a_job_never_stopped(stopped_twice_then_resumed):
    _, _, stopped_err = stopped_twice_then_resumed["by_worker"]
    code, out, err = stopped_twice_then_resumed["resumed"]

    assert code == 0, details(code, out, err)
    # The job never stopped, trained second in these processes, resumes nothing.
    for worker in range(2):
        assert err.count(f"[worker {worker}] BackupAndRestore: resuming from") == 1, err[-4000:]
    resumed = stopped_twice_then_resumed["resumed_out"]
    reference = stopped_twice_then_resumed["reference_out"]
    with open(f"{resumed}.json") as file, open(f"{reference}.json") as reference_file:
        resumed_result, reference_result = json.load(file), json.load(reference_file)
    assert resumed_result["iterations"] == reference_result["iterations"] == TOTAL_STEPS
    assert resumed_result["start_iterations"] == saved_steps(stopped_err, 0)[0]
    assert reference_result["start_iterations"] == 0
    for index, (value, expected) in enumerate(zip(arrays(resumed), arrays(reference))):
        assert value.tobytes() == expected.tobytes(), f"variable {index} differs"
