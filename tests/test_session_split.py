"""`make test`'s split into processes cannot silently skip a marked test file.

Runs pytest on a copy of `tests/conftest.py` and one marked test file, as a
plain pytest session with `--device-counts`, and asks `tests/run_sessions.py`
(what `make test` runs) for its sessions. A session that hangs waits for
its timeout, so `make test` runs this file in a session of its own
(`mostly_waits`).
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import time

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
CONFTEST = os.path.join(TESTS_DIR, "conftest.py")
TIMEOUT_S = 120
pytestmark = pytest.mark.mostly_waits


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


def _run_sessions_module():
    spec = importlib.util.spec_from_file_location(
        "run_sessions", os.path.join(TESTS_DIR, "run_sessions.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _marked_file(tmp_path, *counts):
    marks = "".join(
        f"@pytest.mark.logical_cpus({count})\ndef test_on_{count}():\n    pass\n\n\n"
        for count in counts
    )
    (tmp_path / "test_marked.py").write_text(f"import pytest\n\n\n{marks}")
    return _run_sessions_module()


def test_make_test_refuses_an_unlisted_count_before_running_anything(tmp_path):
    run_sessions = _marked_file(tmp_path, 2, 7)
    marked = run_sessions.marked_counts(tmp_path)
    with pytest.raises(
        ValueError, match=r"test_marked.py \(logical_cpus\(7\)\).*TEST_DEVICE_COUNTS"
    ):
        run_sessions.logical_cpu_sessions(marked, [2, 3, 4])


def test_make_test_runs_a_marked_file_once_per_count_in_a_session_per_count(tmp_path):
    run_sessions = _marked_file(tmp_path, 1, 2, 4)
    (tmp_path / "test_also_marked.py").write_text(
        "import pytest\n\n\n@pytest.mark.logical_cpus(4)\ndef test_on_4():\n    pass\n"
    )
    sessions = run_sessions.logical_cpu_sessions(run_sessions.marked_counts(tmp_path), [2, 3, 4])
    assert [
        (count, sorted(os.path.basename(path) for path in files)) for count, files in sessions
    ] == [(2, ["test_marked.py"]), (4, ["test_also_marked.py", "test_marked.py"])]


def test_files_marked_mostly_waits_at_module_level_get_a_session_of_their_own(tmp_path):
    run_sessions = _run_sessions_module()
    (tmp_path / "test_sleeps.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.mostly_waits\n\n\ndef test_a():\n    pass\n"
    )
    (tmp_path / "test_sleeps_too.py").write_text(
        "import pytest\n\npytestmark = [pytest.mark.timeout(9), pytest.mark.mostly_waits]\n"
    )
    # A mark on one test would still send its file's other tests to the waiting session.
    (tmp_path / "test_one_sleeps.py").write_text(
        "import pytest\n\n\n@pytest.mark.mostly_waits\ndef test_a():\n    pass\n"
    )
    (tmp_path / "test_busy.py").write_text("def test_a():\n    pass\n")

    found = [os.path.basename(path) for path in run_sessions.waiting_files(tmp_path)]

    assert found == ["test_sleeps.py", "test_sleeps_too.py"]


@pytest.mark.parametrize(
    "files, jobs, processes",
    [(0, 2, 1), (5, 2, 1), (8, 2, 1), (9, 2, 2), (21, 2, 2), (21, 4, 3), (21, 1, 1)],
)
def test_a_session_takes_a_process_per_eight_files_up_to_the_jobs(files, jobs, processes):
    run_sessions = _run_sessions_module()

    assert run_sessions.processes_for([f"test_{n}.py" for n in range(files)], jobs) == processes


def test_a_sessions_files_are_dealt_out_longest_first_and_each_process_runs_them_in_name_order():
    run_sessions = _run_sessions_module()
    first, second, third = run_sessions.LONGEST_FIRST[:3]
    files = ["tests/test_a.py", third, "tests/test_b.py", first, second, "tests/test_c.py"]

    dealt = run_sessions.split_files(files, 2)

    assert dealt == [
        sorted([first, third, "tests/test_b.py"]),
        sorted([second, "tests/test_a.py", "tests/test_c.py"]),
    ]
    assert run_sessions.split_files(files, 1) == [sorted(files)]
    for path in run_sessions.LONGEST_FIRST:
        assert os.path.exists(os.path.join(run_sessions.ROOT, path)), path


def test_a_logical_cpu_sessions_files_are_balanced_by_cpu_time_and_its_processes_by_lane(
    monkeypatch,
):
    run_sessions = _run_sessions_module()
    for _, path in run_sessions.LOGICAL_CPU_S:
        assert os.path.exists(os.path.join(run_sessions.ROOT, path)), path
    cpu_s = {"a": 60, "b": 50, "c": 40, "d": 30, "e": 2, "both": 20}
    monkeypatch.setattr(
        run_sessions,
        "LOGICAL_CPU_S",
        {(2, f"tests/test_{key}.py"): value for key, value in cpu_s.items()}
        | {(4, "tests/test_both.py"): 25},
    )
    files = [f"tests/test_{key}.py" for key in ("e", "d", "c", "b", "a", "both")]
    files += ["tests/test_small.py"]  # not listed: SMALL_FILE_CPU_S

    # Largest first, each to the lighter list (the first on a tie): a; b;
    # c (50 < 60); d (60 < 90); both (90 = 90); e, then small (92 < 110).
    dealt = run_sessions.balance_files(files, 2, count=2)

    assert dealt == [
        ["tests/test_a.py", "tests/test_both.py", "tests/test_d.py"],
        ["tests/test_b.py", "tests/test_c.py", "tests/test_e.py", "tests/test_small.py"],
    ]
    assert [sum(run_sessions.cpu_s_of(2, path) for path in group) for group in dealt] == [110, 94]

    # Nine files make 2 processes: the small ones go to the second (98 s).
    nine = [*files, "tests/test_small_1.py", "tests/test_small_2.py"]
    lanes = run_sessions.plan_lanes(
        [(2, nine), (4, ["tests/test_both.py"])], ["tests/test_waits.py"], ["--one"], jobs=2
    )

    # The 4-CPU session (25 s) takes the first lane; the 2-CPU process of
    # 110 s the empty one, and the one of 98 s the first: 123 s and 110 s.
    assert [[name for name, _ in lane] for lane in lanes] == [
        ["tests on 4 logical CPUs", "tests on 2 logical CPUs (2 of 2)"],
        ["tests on 2 logical CPUs (1 of 2)"],
        ["tests on 1 device that mostly wait (tests/test_waits.py)"],
    ]
    assert lanes[1][0][1] == [*dealt[0], "--logical-cpus=2", "-q"]
    assert lanes[0][1][1] == [
        *sorted([*dealt[1], "tests/test_small_1.py", "tests/test_small_2.py"]),
        "--logical-cpus=2",
        "-q",
    ]
    assert lanes[2][0][1] == ["tests/test_waits.py", "--one", "-q"]


def test_a_session_that_hangs_is_stopped_with_its_processes_and_fails(tmp_path):
    run_sessions = _run_sessions_module()
    pid_file = tmp_path / "child.pid"
    (tmp_path / "test_hangs.py").write_text(
        "import subprocess, sys, time\n\n\n"
        "def test_hangs():\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"    open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "    time.sleep(600)\n"
    )
    with open(tmp_path / "output", "w+", encoding="utf-8") as output:
        status, duration_s, _ = run_sessions._pytest(
            [str(tmp_path / "test_hangs.py"), "-p", "no:cacheprovider"], [], output, timeout_s=8
        )
        output.seek(0)
        text = output.read()

    assert status == run_sessions.SESSION_TIMED_OUT
    assert duration_s < 60
    assert "did not end within 8 s; its processes were stopped" in text
    child = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # the test's own child went with the session
        for _ in range(50):
            os.kill(child, 0)
            time.sleep(0.1)
