"""Storage faults while training saves: a full disk, a read-only directory, `kill -9` mid-save.

A full disk: `backup_dir` or `log_dir` is a small tmpfs of its own, filled
by the worker after a chosen optimizer step (see `storage_faults.py`). The
save that then fails makes `fit` raise an error that names the directory;
the backup or `throughput.json` written before is left as it was.

A read-only `backup_dir` or `log_dir` stops training before its first step,
naming it. As root, file permissions do not stop writes, so the directory
is a read-only bind mount of itself in a private mount namespace.

`kill -9` while `BackupAndRestore` writes a backup: the worker saves after
every step a backup of a few MB, so that a save is in progress most of the
time; the test kills it while a save's temporary file exists, then runs the
same arguments again, which must resume from the previous backup, whole.

Starting TensorFlow costs seconds of CPU time, so one worker process trains
the resumed run and then each storage fault in turn (`--then`).
"""

import errno
import os
import signal
import subprocess
import sys
import time

import pytest
import storage_faults

from keras_scaling.preemption import _backup

# The killed run, then the five trainings of one worker.
pytestmark = pytest.mark.timeout(6 * storage_faults.RUN_TIMEOUT_S + 60)

TOTAL_STEPS = 64  # 2 epochs of 32 steps

READ_ONLY_CASES = [
    # BackupAndRestore checks when fit starts: the OSError of the write.
    ("--backup-dir", "backup_dir", ("OSError",)),
    # ThroughputLogger checks when it is made (ValueError) and again when
    # fit starts (OSError), for a directory made read-only in between.
    ("--log-dir", "log_dir", ("ValueError", "OSError")),
]


def _kill_args(directory):
    return [
        "--report",
        str(directory / "report.json"),
        "--backup-dir",
        str(directory / "backup"),
        "--save-every",
        "1",
        "--units",
        "100000",  # 2.4 MB of variables per backup
    ]


def _kill_during_a_save(directory):
    backup_dir = directory / "backup"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    worker = subprocess.Popen(
        [sys.executable, storage_faults.WORKER, *_kill_args(directory)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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


def _full_disk_runs(directory):
    """The runs of `storage_faults.run_workers` whose disk fills; their directories.

    With a 1 MB `backup_dir`, filled after step 7 but for 4 KB, so that the
    next save (about 30 KB) starts, then fails; then with a 2 MB `log_dir`,
    filled after step 40, in the second epoch, after the first epoch's record.
    """
    backup_dir, log_dir = directory / "backup", directory / "logs"
    backup_args = ["--backup-dir", backup_dir, "--save-every", "5", "--units", "256"]
    backup_args += ["--fill-dir", backup_dir, "--fill-after-step", "7", "--leave-bytes", "4096"]
    log_args = ["--log-dir", log_dir, "--fill-dir", log_dir, "--fill-after-step", "40"]
    runs = [
        ([storage_faults.tmpfs(backup_dir, "1m")], directory / "backup.json", backup_args),
        ([storage_faults.tmpfs(log_dir, "2m")], directory / "logs.json", log_args),
    ]
    return runs, (backup_dir, log_dir)


def _read_only_runs(directory):
    """The runs of `storage_faults.run_workers` whose directory is read-only, one epoch each."""
    directories = {option: directory / option.strip("-") for option, _, _ in READ_ONLY_CASES}
    runs = [
        ([storage_faults.read_only(path)], f"{path}.json", [option, path, "--epochs", "1"])
        for option, path in directories.items()
    ]
    return runs, directories


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """What each fault left: `{"killed": (backup header read after the kill, resumed report)}`,
    and where private mounts are allowed `"full_disks"`: `(backup_dir, log_dir, [report of
    the backup run, report of the logging run])` and `"read_only"`: `{option: (read-only
    directory, report)}`.
    """
    tmp_path = tmp_path_factory.mktemp("storage_faults")
    killed = tmp_path / "killed"
    killed.mkdir()
    _kill_during_a_save(killed)
    header, _ = _backup.read(killed / "backup")  # raises if the backup were damaged

    runs = [([], killed / "report.json", _kill_args(killed)[2:])]
    if storage_faults.mount_namespaces_unavailable() is None:
        full_disk_runs, full_disk_dirs = _full_disk_runs(tmp_path / "full_disks")
        read_only_runs, read_only_dirs = _read_only_runs(tmp_path / "read_only")
        runs += full_disk_runs + read_only_runs
    reports = storage_faults.run_workers(runs)
    found = {"killed": (header, reports[0])}
    if len(reports) > 1:
        found["full_disks"] = (*full_disk_dirs, reports[1:3])
        found["read_only"] = {
            option: (read_only_dirs[option], report)
            for option, report in zip(read_only_dirs, reports[3:5])
        }
    return found


def test_a_worker_killed_during_a_save_leaves_the_previous_backup_and_resumes_from_it(faults):
    header, report = faults["killed"]

    saved_iterations = header["position"]["iterations"]
    assert 0 < saved_iterations < TOTAL_STEPS
    assert report["error"] is None, report["error"]
    assert report["start_iterations"] == saved_iterations
    assert report["iterations"] == TOTAL_STEPS


@pytest.fixture
def full_disks(faults):
    storage_faults.skip_without_mount_namespaces()
    return faults["full_disks"]


def test_a_backup_save_on_a_full_disk_names_the_directory_and_keeps_the_previous_backup(
    full_disks,
):
    backup_dir, _, (report, _) = full_disks

    error = report["error"]
    assert error is not None and error["errno"] == errno.ENOSPC, report
    assert str(backup_dir) in error["message"]
    assert report["iterations"] == 10  # the step whose save failed
    assert report["backup_position"]["iterations"] == 5  # the save before
    assert report["backup_dir_files"] == ["backup.npz", "filler"]  # no half-written file


def test_a_throughput_record_on_a_full_disk_names_the_directory_and_keeps_the_previous_one(
    full_disks,
):
    _, log_dir, (_, report) = full_disks

    # The first write to fail may be the event file's (TensorFlow's error)
    # or throughput.json's (an OSError): either names the file in log_dir.
    error = report["error"]
    assert error is not None, report
    assert str(log_dir) in error["message"]
    assert "No space left on device" in error["message"]
    assert report["iterations"] == 64  # training itself went to its end
    assert report["record_after"] == report["record_before_fill"]


@pytest.mark.parametrize("option, parameter, expected_errors", READ_ONLY_CASES)
def test_a_read_only_directory_fails_before_the_first_step(
    faults, option, parameter, expected_errors
):
    storage_faults.skip_without_mount_namespaces()
    directory, report = faults["read_only"][option]
    error = report["error"]
    assert error is not None, report
    assert report["iterations"] == 0  # not one step was trained
    assert f"{parameter}={str(directory)!r}" in error["message"]
    assert error["type"] in expected_errors
