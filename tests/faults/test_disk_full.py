"""The disk fills while training saves: what was saved before stays whole and readable.

`backup_dir` or `log_dir` is a small tmpfs of its own, filled by the worker
after a chosen optimizer step (see `storage_faults.py`); one worker process
trains once for each. The save that then fails makes `fit` raise an error
that names the directory; the backup or `throughput.json` written before is
left as it was.
"""

import errno

import pytest
import storage_faults

pytestmark = pytest.mark.timeout(2 * storage_faults.RUN_TIMEOUT_S + 60)


@pytest.fixture(scope="module")
def full_disks(tmp_path_factory):
    """`(backup_dir, log_dir, [report of the backup run, report of the logging run])`.

    One worker trains twice: with a 1 MB `backup_dir`, filled after step 7
    but for 4 KB, so that the next save (about 30 KB) starts, then fails; then
    with a 2 MB `log_dir`, filled after step 40, in the second epoch, after
    the first epoch's record.
    """
    storage_faults.skip_without_mount_namespaces()
    tmp_path = tmp_path_factory.mktemp("full_disks")
    backup_dir, log_dir = tmp_path / "backup", tmp_path / "logs"
    backup_args = ["--backup-dir", backup_dir, "--save-every", "5", "--units", "256"]
    backup_args += ["--fill-dir", backup_dir, "--fill-after-step", "7", "--leave-bytes", "4096"]
    log_args = ["--log-dir", log_dir, "--fill-dir", log_dir, "--fill-after-step", "40"]
    reports = storage_faults.run_workers(
        [
            ([storage_faults.tmpfs(backup_dir, "1m")], tmp_path / "backup.json", backup_args),
            ([storage_faults.tmpfs(log_dir, "2m")], tmp_path / "logs.json", log_args),
        ]
    )
    return backup_dir, log_dir, reports


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
