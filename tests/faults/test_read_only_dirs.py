"""A read-only `backup_dir` or `log_dir` stops training before its first step, naming it.

As root, file permissions do not stop writes, so the directory is a
read-only bind mount of itself in a private mount namespace (see
`storage_faults.py`).
"""

import pytest
import storage_faults

pytestmark = pytest.mark.timeout(2 * storage_faults.RUN_TIMEOUT_S + 60)

CASES = [
    # BackupAndRestore checks when fit starts: the OSError of the write.
    ("--backup-dir", "backup_dir", ("OSError",)),
    # ThroughputLogger checks when it is made (ValueError) and again when
    # fit starts (OSError), for a directory made read-only in between.
    ("--log-dir", "log_dir", ("ValueError", "OSError")),
]


@pytest.fixture(scope="module")
def read_only_runs(tmp_path_factory):
    """`{option: (read-only directory, report)}`, one worker training once per case in turn."""
    storage_faults.skip_without_mount_namespaces()
    tmp_path = tmp_path_factory.mktemp("read_only_runs")
    directories = {option: tmp_path / option.strip("-") for option, _, _ in CASES}
    reports = storage_faults.run_workers(
        [
            ([storage_faults.read_only(path)], f"{path}.json", [option, path, "--epochs", "1"])
            for option, path in directories.items()
        ]
    )
    return {option: (directories[option], found) for option, found in zip(directories, reports)}


@pytest.mark.parametrize("option, parameter, expected_errors", CASES)
def test_a_read_only_directory_fails_before_the_first_step(
    read_only_runs, option, parameter, expected_errors
):
    directory, report = read_only_runs[option]
    error = report["error"]
    assert error is not None, report
    assert report["iterations"] == 0  # not one step was trained
    assert f"{parameter}={str(directory)!r}" in error["message"]
    assert error["type"] in expected_errors
