"""`make test`'s split into processes cannot silently skip a marked test file.

Runs pytest on a copy of `tests/conftest.py` and one marked test file, as
`make test` runs its first process (`--device-counts` with its list).
"""

import os
import shutil
import subprocess
import sys

CONFTEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
TIMEOUT_S = 120


def run_first_session(tmp_path, device_count):
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n\n\n"
        f"@pytest.mark.logical_cpus({device_count})\n"
        "def test_marked():\n    pass\n"
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(tmp_path),
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            "--device-counts",
            "2 3 4",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=tmp_path,
    )


def test_a_file_marked_with_an_unlisted_device_count_fails_naming_it(tmp_path):
    result = run_first_session(tmp_path, 7)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "test_marked.py (logical_cpus(7))" in output
    assert "TEST_DEVICE_COUNTS" in output


def test_a_file_marked_with_a_listed_device_count_is_collected_for_its_process(tmp_path):
    result = run_first_session(tmp_path, 3)
    assert result.returncode == 5, result.stdout + result.stderr  # 5: none selected here
