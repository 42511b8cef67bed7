"""Runs the whole test suite as `make test` does: each test in a process split into the CPUs it needs.

TensorFlow fixes its logical devices once per process. So:

1. the unmarked tests run in one pytest session on one device, spread over
   `--jobs` worker processes a file at a time (pytest-xdist);
2. beside it, for each count N in turn, largest first, the test files
   marked `logical_cpus(N)`, split into N logical CPUs, in one process per
   `FILES_PER_PROCESS` of them, up to `--jobs`: each process a pytest
   session of its own (`balance_files` deals the files out by their CPU
   time, each process runs its share in name order, and `plan_lanes` puts
   each process in the lane with the least CPU time so far). A file marked
   with a count not in `--device-counts` fails the run, named, before
   anything runs;
3. beside both, the files marked `mostly_waits` (a module-level
   `pytestmark`: their wall-clock time is mostly sleeps and timers) run on
   one device, each in a session of its own (up to `--jobs` of them),
   instead of in the first one, so that their waits hold no worker of it.

The output of 2 and 3 is shown when the first session ends.

Starting TensorFlow costs each process seconds of CPU time, so the files of
a session share its processes (tests/conftest.py keeps their
MirroredStrategy objects from clashing). Many tests wait on processes of
their own, on timers, or on TensorFlow freeing an iterator, so `--jobs`
defaults to the number of cores and the other sessions take the cores
those waits leave idle. The largest count runs first: in this suite its
session is the shortest, and it ends waiting on the iterators it frees; run
first, those waits leave a core to the other sessions, while run last they
left a core idle for about 20 s at the end. The run fails when any session
failed. Each session's wall-clock and CPU time is printed (the CPU time of
its processes and of those they waited for): on this suite, the CPU time
decides the wall-clock time.

Usage: python tests/run_sessions.py [--jobs N] [--device-counts "2 4"] [PYTEST ARGS...]
"""

import argparse
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS_DIR)
# pytest's exit status when a session selects no test.
NO_TESTS_COLLECTED = 5
# A session still running after this long has hung (a pytest-xdist
# controller waits for ever for a worker that crashed), and fails the run
# with this status instead of holding it until CI's own limit.
SESSION_TIMEOUT_S = 20 * 60
SESSION_TIMED_OUT = 124
# The process groups of the sessions running now (stopped if make test is).
_running = set()
# A session of N logical CPUs takes one process per this many of its files:
# each process pays TensorFlow's start and its modules' fixtures again.
FILES_PER_PROCESS = 8
# CPU seconds of the tests of a file on N logical CPUs, `(N, file): s`, in
# one `make test` (benchmarks/suite_cpu.py), for the files above 3 s. Those
# processes share the cores with every other session from start to end, so
# their CPU time decides how long they run: `balance_files` deals out the
# files by it, and each process goes to the lane with the least CPU time so
# far. Dealt out longest first instead, one process of the 2 held 236 s of
# the 314 and ended the whole run 29 s after every other session.
LOGICAL_CPU_S = {
    (2, "tests/real_models/test_real_models.py"): 66,
    (2, "tests/callbacks/test_replica_sync.py"): 49,
    (2, "tests/explain/test_explain_known_answers.py"): 41,
    (2, "tests/callbacks/test_custom_train_step.py"): 31,
    (2, "tests/callbacks/test_throughput_logger.py"): 26,
    (2, "tests/test_probes_mirrored.py"): 20,
    (2, "tests/tune/test_tune_mirrored.py"): 18,
    (2, "tests/test_compat_mirrored.py"): 16,
    (2, "tests/test_tensorboard.py"): 9,
    (2, "tests/test_compat_input_dtypes.py"): 7,
    (2, "tests/test_data_wrapping.py"): 7,
    (2, "tests/test_event_file_lifetime.py"): 7,
    (2, "tests/callbacks/test_throughput_logger_flops.py"): 6,
    (2, "tests/callbacks/test_loss_scale.py"): 5,
    (2, "tests/test_docstring_examples.py"): 4,
    (2, "tests/test_replica_state.py"): 4,
    (2, "tests/test_data_pipeline_options.py"): 4,
    (4, "tests/test_compat_mirrored.py"): 17,
    (4, "tests/test_data_mirrored.py"): 7,
}
# What a file not in LOGICAL_CPU_S counts for.
SMALL_FILE_CPU_S = 2
# The files that take the longest (wall-clock, measured in `make test` on 2
# cores): handed out first by the sessions of several processes, on one
# device (tests/conftest.py orders pytest-xdist's queue by it; pytest-xdist's
# own order, the files with the most tests first, left these to run alone at
# the end), and among the files that mostly wait, whose two longest go to
# sessions of their own (`split_files`).
LONGEST_FIRST = (
    "tests/explain/test_explain_critical_path.py",
    "tests/tune/test_tune_cli.py",
    "tests/cli/test_bench.py",
    "tests/multi_worker/test_multi_worker_training.py",
    "tests/test_compat_multi_worker.py",
    "tests/test_examples.py",
    "tests/cli/test_doctor.py",
    "tests/callbacks/test_backup_and_restore.py",
    "tests/multi_worker/test_backup_multi_worker.py",
    "tests/multi_worker/test_cluster_env_workers.py",
    "tests/test_docstring_examples.py",
    "tests/real_models/test_real_models.py",
    "tests/test_probes_mirrored.py",
    "tests/callbacks/test_replica_sync.py",
    "tests/tune/test_tune_mirrored.py",
    "tests/explain/test_explain_known_answers.py",
    "tests/test_compat_mirrored.py",
    "tests/callbacks/test_throughput_logger.py",
    "tests/test_baseline_failure.py",
)
_MOSTLY_WAITS = re.compile(r"^pytestmark = .*\bpytest\.mark\.mostly_waits\b", re.M)


def _test_files(tests_dir):
    """`(path relative to the root, source)` of each test file under `tests_dir`."""
    for directory, _, names in sorted(os.walk(tests_dir)):
        for name in sorted(names):
            if name.startswith("test_") and name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as file:
                    yield os.path.relpath(path, ROOT), file.read()


def marked_counts(tests_dir):
    """`{test file: sorted counts N of its logical_cpus(N) marks}`, paths relative to the root."""
    found = {}
    for path, source in _test_files(tests_dir):
        counts = {int(n) for n in re.findall(r"mark\.logical_cpus\((\d+)\)", source)}
        if counts:
            found[path] = sorted(counts)
    return found


def waiting_files(tests_dir):
    """The test files whose module-level `pytestmark` holds `mostly_waits`, relative to the root."""
    return [path for path, source in _test_files(tests_dir) if _MOSTLY_WAITS.search(source)]


def processes_for(files, jobs):
    """Processes for a session of `files`: one per `FILES_PER_PROCESS`, at least 1, at most `jobs`."""
    return max(1, min(jobs, math.ceil(len(files) / FILES_PER_PROCESS)))


def split_files(files, processes):
    """`files` dealt out to `processes` lists in turn, those of `LONGEST_FIRST` first; each list in name order."""
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    dealt = sorted(files, key=lambda path: (rank.get(path, len(rank)), path))
    return [sorted(dealt[start::processes]) for start in range(processes)]


def balance_files(files, processes, count):
    """`files` of the session on `count` logical CPUs dealt out to `processes` lists, each list in name order.

    The files go in order of their `LOGICAL_CPU_S`, largest first, each to
    the list with the least CPU time so far.
    """
    groups = [[] for _ in range(processes)]
    loads = [0] * processes
    for path in sorted(files, key=lambda path: (-cpu_s_of(count, path), path)):
        lightest = loads.index(min(loads))
        groups[lightest].append(path)
        loads[lightest] += cpu_s_of(count, path)
    return [sorted(group) for group in groups]


def cpu_s_of(count, path):
    """The CPU seconds `LOGICAL_CPU_S` gives a file on `count` logical CPUs."""
    return LOGICAL_CPU_S.get((count, path), SMALL_FILE_CPU_S)


def plan_lanes(marked_sessions, waiting, one_device, jobs):
    """The sessions beside the first: `[[(name, pytest arguments)]]`, a list per lane, run in turn.

    The processes of each session of `marked_sessions` (largest count
    first), the one with the most CPU time first, each go to the one of
    `jobs` lanes with the least CPU time so far; the `waiting` files' sessions
    take a lane each.
    """
    lanes = [[] for _ in range(jobs)]
    lane_cpu_s = [0] * jobs
    for count, files in reversed(marked_sessions):
        groups = balance_files(files, processes_for(files, jobs), count)
        weighed = [(sum(cpu_s_of(count, path) for path in group), group) for group in groups]
        for index, (group_cpu_s, group) in sorted(enumerate(weighed), key=lambda x: -x[1][0]):
            part = f" ({index + 1} of {len(groups)})" if len(groups) > 1 else ""
            lane = lane_cpu_s.index(min(lane_cpu_s))
            lanes[lane].append(
                (f"tests on {count} logical CPUs{part}", [*group, f"--logical-cpus={count}", "-q"])
            )
            lane_cpu_s[lane] += group_cpu_s
    for group in split_files(waiting, min(jobs, len(waiting))) if waiting else []:
        name = f"tests on 1 device that mostly wait ({', '.join(group)})"
        lanes.append([(name, [*group, *one_device, "-q"])])
    return [sessions for sessions in lanes if sessions]


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


def _pytest(arguments, extra, output=None, timeout_s=None):
    """Runs a pytest session; returns its exit status, wall time and CPU time in s.

    The CPU time is that of the session's processes and of the processes they
    waited for: the figure that decides the suite's time on a busy machine.
    A session still running after `timeout_s` (default `SESSION_TIMEOUT_S`)
    has hung: its processes are killed and the status is `SESSION_TIMED_OUT`.
    """
    timeout_s = SESSION_TIMEOUT_S if timeout_s is None else timeout_s
    start_s = time.monotonic()
    # A process group of its own: stopping the session stops its workers too.
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", *arguments, *extra],
        cwd=ROOT,
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        start_new_session=True,
    )
    _running.add(process.pid)
    timed_out = threading.Event()

    def stop():
        timed_out.set()
        _stop_group(process.pid)

    timer = threading.Timer(timeout_s, stop)
    timer.daemon = True
    timer.start()
    try:
        _, status, usage = os.wait4(process.pid, 0)
    finally:
        timer.cancel()
        _stop_group(process.pid)  # what the session left running; all of it when interrupted
        _running.discard(process.pid)
    process.returncode = os.waitstatus_to_exitcode(status)
    if timed_out.is_set():
        message = f"make test: the session did not end within {timeout_s:.0f} s; its processes were stopped\n"
        if output is not None:
            output.write(message)
            output.flush()
        else:
            print(message, end="", flush=True)
        process.returncode = SESSION_TIMED_OUT
    return process.returncode, time.monotonic() - start_s, usage.ru_utime + usage.ru_stime


def _stop_group(pid):
    """Kills the process group `pid` leads, if any of it is left."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
    # Cached bytecode, whatever the environment says: otherwise each of the
    # suite's Python processes compiles keras_scaling and the test modules
    # again (1.7 s of CPU for each pytest process's collection alone).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        marked_sessions = logical_cpu_sessions(marked_counts(TESTS_DIR), device_counts)
    except ValueError as error:
        print(f"make test: {error}", file=sys.stderr)
        return 2
    waiting = waiting_files(TESTS_DIR)
    one_device = ["--logical-cpus=1", f"--device-counts={args.device_counts}"]
    failed = []
    run_start_s = time.monotonic()

    lanes = plan_lanes(marked_sessions, waiting, one_device, args.jobs)
    stop = threading.Event()
    threads = []
    for sessions in lanes:
        results = []
        thread = threading.Thread(
            target=_run_in_turn, args=(sessions, pytest_args, results, stop), daemon=True
        )
        thread.start()
        threads.append((thread, sessions, results))
    name = "tests on 1 device"
    print(f"== {name} ==", flush=True)
    try:
        returncode, duration_s, cpu_s = _pytest(
            [
                "tests",
                *one_device,
                *(f"--ignore={path}" for path in waiting),
                *_workers(args.jobs),
            ],
            pytest_args,
        )
        print(f"== {name} took {duration_s:.0f} s, {cpu_s:.0f} s of CPU ==", flush=True)
        total_cpu_s = cpu_s
        if not _passed(returncode):
            failed.append(name)
        for thread, _, _ in threads:
            thread.join()
    except BaseException:  # interrupted: the lanes' sessions stop too
        for pid in list(_running):
            _stop_group(pid)
        raise
    finally:
        stop.set()
    for _, sessions, results in threads:
        for name, returncode, duration_s, cpu_s, output in results:
            print(f"== {name} ==\n{output}", flush=True)
            print(f"== {name} took {duration_s:.0f} s, {cpu_s:.0f} s of CPU ==", flush=True)
            total_cpu_s += cpu_s
            if not _passed(returncode):
                failed.append(name)
        # A session the lane did not finish (it raised) fails the run too.
        failed += [name for name, _ in sessions[len(results) :]]

    took = f"{time.monotonic() - run_start_s:.0f} s, {total_cpu_s:.0f} s of CPU"
    if failed:
        print(f"make test: failed sessions ({took}): " + "; ".join(failed))
        return 1
    print(f"make test: every session passed ({took})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
