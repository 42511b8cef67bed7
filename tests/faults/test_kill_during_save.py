"""`kill -9` while `BackupAndRestore` writes a backup: the previous one is whole, and resumes.

The worker saves after every step a backup of a few MB, so that a save is
in progress most of the time; the test kills it while a save's temporary
file exists, then runs the same command again.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import storage_faults

from keras_scaling.preemption import _backup

pytestmark = pytest.mark.timeout(3 * storage_faults.RUN_TIMEOUT_S)

TOTAL_STEPS = 64  # 2 epochs of 32 steps


def _command(tmp_path):
    return [
        sys.executable,
        storage_faults.WORKER,
        "--report",
        str(tmp_path / "report.json"),
        "--backup-dir",
        str(tmp_path / "backup"),
        "--save-every",
        "1",
        "--units",
        "100000",  # 2.4 MB of variables per backup
    ]


def _kill_during_a_save(tmp_path):
    backup_dir = tmp_path / "backup"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    worker = subprocess.Popen(
        _command(tmp_path), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + storage_faults.RUN_TIMEOUT_S
        while True:
            assert time.monotonic() < deadline, "no save was caught in progress"
            assert worker.poll() is None, "training ended before a save could be killed"
            names = os.listdir(backup_dir) if backup_dir.exists() else []
            if _backup.FILE_NAME in names and any(name.endswith(".tmp") for name in names):
                worker.send_signal(signal.SIGKILL)
                break
            time.sleep(0.001)
    finally:
        worker.kill()
        worker.wait()


def test_a_worker_killed_during_a_save_leaves_the_previous_backup_and_resumes_from_it(tmp_path):
    _kill_during_a_save(tmp_path)
    header, _ = _backup.read(tmp_path / "backup")  # raises if the backup were damaged
    saved_iterations = header["position"]["iterations"]
    assert 0 < saved_iterations < TOTAL_STEPS

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    resumed = subprocess.run(
        _command(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=storage_faults.RUN_TIMEOUT_S,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with open(tmp_path / "report.json") as file:
        report = json.load(file)
    assert report["error"] is None, report["error"]
    assert report["start_iterations"] == saved_iterations
    assert report["iterations"] == TOTAL_STEPS
