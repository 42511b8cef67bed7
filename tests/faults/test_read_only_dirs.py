"""A read-only `backup_dir` or `log_dir` stops training before its first step, naming it.

As root, file permissions do not stop writes, so the directory is a
read-only bind mount of itself in a private mount namespace (see
`storage_faults.py`).
"""

import pytest
import storage_faults

pytestmark = pytest.mark.timeout(storage_faults.RUN_TIMEOUT_S + 60)


@pytest.mark.parametrize(
    "option, parameter, expected_errors",
    [
        # BackupAndRestore checks when fit starts: the OSError of the write.
        ("--backup-dir", "backup_dir", ("OSError",)),
        # ThroughputLogger checks when it is made (ValueError) and again when
        # fit starts (OSError), for a directory made read-only in between.
        ("--log-dir", "log_dir", ("ValueError", "OSError")),
    ],
)
def test_a_read_only_directory_fails_before_the_first_step(
    tmp_path, option, parameter, expected_errors
):
    storage_faults.skip_without_mount_namespaces()
    directory = tmp_path / "read_only"
    report = storage_faults.run_worker(
        [storage_faults.read_only(directory)],
        tmp_path / "report.json",
        option,
        directory,
        "--epochs",
        "1",
    )

    error = report["error"]
    assert error is not None, report
    assert report["iterations"] == 0  # not one step was trained
    assert f"{parameter}={str(directory)!r}" in error["message"]
    assert error["type"] in expected_errors
