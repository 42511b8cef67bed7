"""Runs the whole test suite as `make test` does: each test in a process split into the CPUs it needs.

TensorFlow fixes its logical devices once per process. So:

1. the unmarked tests run in one pytest session on one device, spread over
   `--jobs` worker processes a file at a time (pytest-xdist);
2. beside it, for each count N in turn, largest first, the test files
   marked `logical_cpus(N)` run in one more session, in one process split
   into N logical CPUs. Their output is shown when the first session ends. A
   file marked with a count not in `--device-counts` fails the run, named,
   before anything runs.

Starting TensorFlow costs each process seconds of CPU time, so the files of
a count share their process (tests/conftest.py keeps their MirroredStrategy
objects from clashing). Many tests of the first session wait on processes
of their own or sleep, so `--jobs` defaults to the number of cores and the
marked sessions take the cores those waits leave idle. The largest count
runs first: in this suite its session is the shortest, and it ends waiting
on the iterators it frees; run first, those waits leave a core to the other
sessions, while run last they left a core idle for about 20 s at the end.
The run fails when any session failed. Each session's wall-clock and CPU
time is printed (the CPU time of its processes and of those they waited for):
on this suite, the CPU time decides the wall-clock time.

Usage: python tests/run_sessions.py [--jobs N] [--device-counts "2 4"] [PYTEST ARGS...]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS_DIR)
# pytest's exit status when a session selects no test.
NO_TESTS_COLLECTED = 5


def marked_counts(tests_dir):
    """`{test file: sorted counts N of its logical_cpus(N) marks}`, paths relative to the root."""
    found = {}
    for directory, _, names in os.walk(tests_dir):
        for name in names:
            if name.startswith("test_") and name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as file:
                    counts = {
                        int(n) for n in re.findall(r"mark\.logical_cpus\((\d+)\)", file.read())
                    }
                if counts:
                    found[os.path.relpath(path, ROOT)] = sorted(counts)
    return found


def logical_cpu_sessions(marked, device_counts):
    """`[(N, [test files marked logical_cpus(N)])]`, one per count N above 1, in order of N.

    Raises:
        ValueError: a file is marked with a count not in `device_counts`
            (no session would run its tests).
    """
    unlisted = [
        f"{path} (logical_cpus({count}))"
        for path, counts in sorted(marked.items())
        for count in counts
        if count != 1 and count not in device_counts
    ]
    if unlisted:
        raise ValueError(
            "tests marked with a device count that make test does not run "
            f"(TEST_DEVICE_COUNTS is {' '.join(map(str, device_counts))!r}): "
            f"{', '.join(unlisted)}. Add the count to TEST_DEVICE_COUNTS in the "
            "Makefile, or mark the tests with a listed one."
        )
    files = {}
    for path, counts in sorted(marked.items()):
        for count in counts:
            if count != 1:
                files.setdefault(count, []).append(path)
    return sorted(files.items())


def _workers(jobs):
    """pytest-xdist's arguments for `jobs` processes taking a file at a time, if more than one.

    Files go out in the order collected (tests/conftest.py puts the longest
    first), not xdist's default of the files with the most tests first.
    """
    return ["-n", str(jobs), "--dist", "loadfile", "--no-loadscope-reorder"] if jobs > 1 else []


def _pytest(arguments, extra, output=None):
    """Runs a pytest session; returns its exit status, wall time and CPU time in s.

    The CPU time is that of the session's processes and of the processes they
    waited for: the figure that decides the suite's time on a busy machine.
    """
    start_s = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", *arguments, *extra],
        cwd=ROOT,
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
    )
    try:
        _, status, usage = os.wait4(process.pid, 0)
    except BaseException:
        process.kill()
        process.wait()
        raise
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, time.monotonic() - start_s, usage.ru_utime + usage.ru_stime


def _run_in_turn(sessions, extra, results, stop):
    """Runs `sessions` one after another until `stop` is set, appending (name, status, s, CPU s, output) to `results`."""
    for name, arguments in sessions:
        if stop.is_set():
            return
        with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as output:
            returncode, duration_s, cpu_s = _pytest(arguments, extra, output)
            output.seek(0)
            results.append((name, returncode, duration_s, cpu_s, output.read()))


def _passed(returncode):
    return returncode in (0, NO_TESTS_COLLECTED)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--device-counts", default="2 4")
    args, pytest_args = parser.parse_known_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be a positive integer, got {args.jobs}")
    device_counts = [int(n) for n in args.device_counts.replace(",", " ").split()]
    try:
        marked_sessions = logical_cpu_sessions(marked_counts(TESTS_DIR), device_counts)
    except ValueError as error:
        print(f"make test: {error}", file=sys.stderr)
        return 2
    failed = []
    run_start_s = time.monotonic()

    marked = [
        (f"tests on {count} logical CPUs", [*files, f"--logical-cpus={count}", "-q"])
        for count, files in reversed(marked_sessions)
    ]
    marked_results, stop = [], threading.Event()
    marked_lane = threading.Thread(
        target=_run_in_turn, args=(marked, pytest_args, marked_results, stop), daemon=True
    )
    marked_lane.start()
    name = "tests on 1 device"
    print(f"== {name} ==", flush=True)
    try:
        returncode, duration_s, cpu_s = _pytest(
            [
                "tests",
                "--logical-cpus=1",
                f"--device-counts={args.device_counts}",
                *_workers(args.jobs),
            ],
            pytest_args,
        )
        print(f"== {name} took {duration_s:.0f} s, {cpu_s:.0f} s of CPU ==", flush=True)
        total_cpu_s = cpu_s
        if not _passed(returncode):
            failed.append(name)
        marked_lane.join()
    finally:
        stop.set()
    for name, returncode, duration_s, cpu_s, output in marked_results:
        print(f"== {name} ==\n{output}", flush=True)
        print(f"== {name} took {duration_s:.0f} s, {cpu_s:.0f} s of CPU ==", flush=True)
        total_cpu_s += cpu_s
        if not _passed(returncode):
            failed.append(name)
    # A session the lane did not finish (it raised) fails the run too.
    failed += [name for name, _ in marked[len(marked_results) :]]

    took = f"{time.monotonic() - run_start_s:.0f} s, {total_cpu_s:.0f} s of CPU"
    if failed:
        print(f"make test: failed sessions ({took}): " + "; ".join(failed))
        return 1
    print(f"make test: every session passed ({took})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
