"""Runs the whole test suite as `make test` does: each test in a process split into the CPUs it needs.

TensorFlow fixes its logical devices once per process. So:

1. the unmarked tests run in one pytest session on one device, spread over
   `--jobs` worker processes a file at a time (pytest-xdist);
2. then, for each count N, the test files marked `logical_cpus(N)` run in one
   more session, in up to `--jobs` worker processes split into N logical
   CPUs, a file at a time. A file marked with a count not in
   `--device-counts` fails the run, named, before anything runs.

Starting TensorFlow costs each process seconds of CPU time, so the files of
a count share their processes (tests/conftest.py keeps their
MirroredStrategy objects from clashing). Most tests wait on processes of
their own or on Python, about one core's work at a time, so `--jobs`
defaults to the number of cores. The run fails when any session failed.

Usage: python tests/run_sessions.py [--jobs N] [--device-counts "2 3 4"] [PYTEST ARGS...]
"""

import argparse
import os
import re
import subprocess
import sys
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
    """pytest-xdist's arguments for `jobs` processes taking a file at a time, if more than one."""
    return ["-n", str(jobs), "--dist", "loadfile"] if jobs > 1 else []


def _pytest(arguments, extra):
    start_s = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pytest", *arguments, *extra], cwd=ROOT)
    return result.returncode, time.monotonic() - start_s


def _passed(returncode):
    return returncode in (0, NO_TESTS_COLLECTED)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--device-counts", default="2 3 4")
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

    sessions = [
        (
            "tests on 1 device",
            ["tests", "--logical-cpus=1", f"--device-counts={args.device_counts}"],
            args.jobs,
        )
    ] + [
        (
            f"tests on {count} logical CPUs",
            [*files, f"--logical-cpus={count}", "-q"],
            min(args.jobs, len(files)),
        )
        for count, files in marked_sessions
    ]
    for name, arguments, jobs in sessions:
        print(f"== {name} ==", flush=True)
        returncode, duration_s = _pytest([*arguments, *_workers(jobs)], pytest_args)
        print(f"== {name} took {duration_s:.0f} s ==", flush=True)
        if not _passed(returncode):
            failed.append(name)

    total_s = time.monotonic() - run_start_s
    if failed:
        print(f"make test: failed sessions ({total_s:.0f} s): " + "; ".join(failed))
        return 1
    print(f"make test: every session passed ({total_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
