"""Where `make test`'s CPU time goes: each test file's, with the processes its tests waited for.

Run: `python benchmarks/suite_cpu.py [--most N] [--log PATH]`, from the
repository (one whole `make test`, about 8 to 10 minutes on 2 cores).

On this suite the CPU time decides the wall-clock time: both cores are busy
from start to end. This runs `make test` once with this file loaded as a
pytest plugin into every session (`-p suite_cpu`). Around each test it
reads the CPU time of its own process and of the child processes the
process has waited for (`getrusage`), so a test that launches workers is
charged with theirs. It prints the files by CPU time, with how much of it
is child processes, the wall-clock time and the number of tests, and then
the totals against `make test`'s own. A child process is charged to the
test during which it was waited for (a module fixture's launch to the first
test that uses it); one never waited for, to no test.
"""

import argparse
import collections
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The file each test's figures are appended to; set for the sessions by `main`.
LOG_ENV = "KERAS_SCALING_SUITE_CPU_LOG"


def _cpu_s(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def pytest_runtest_protocol(item, nextitem):
    """Appends `node id, own CPU s, children's CPU s, wall s` of the test to the log."""
    own, children = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    try:
        return (yield)
    finally:
        row = (
            item.nodeid,
            f"{_cpu_s(resource.RUSAGE_SELF) - own:.3f}",
            f"{_cpu_s(resource.RUSAGE_CHILDREN) - children:.3f}",
            f"{time.monotonic() - started:.3f}",
        )
        with open(os.environ[LOG_ENV], "a", encoding="utf-8") as log:
            log.write("\t".join(row) + "\n")


try:
    import pytest
except ImportError:  # run as a script, outside the test environment
    pass
else:
    pytest_runtest_protocol = pytest.hookimpl(wrapper=True)(pytest_runtest_protocol)


def per_file(rows):
    """`{test file: [own CPU s, children's CPU s, wall s, tests]}` of the log's rows."""
    files = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for node_id, own, children, wall in rows:
        totals = files[node_id.split("::")[0]]
        totals[0] += float(own)
        totals[1] += float(children)
        totals[2] += float(wall)
        totals[3] += 1
    return dict(files)


def read_log(path):
    with open(path, encoding="utf-8") as log:
        return [line.rstrip("\n").split("\t") for line in log if line.strip()]


def table(files, most):
    """The `most` files of the largest CPU time, one line each, largest first."""
    lines = [f"{'CPU s':>7} {'children':>8} {'wall s':>7} {'tests':>5}  file"]
    ranked = sorted(files.items(), key=lambda item: -(item[1][0] + item[1][1]))
    for path, (own, children, wall, tests) in ranked[:most]:
        lines.append(f"{own + children:7.1f} {children:8.1f} {wall:7.1f} {tests:5d}  {path}")
    if len(ranked) > most:
        rest = ranked[most:]
        cpu = sum(own + children for _, (own, children, _, _) in rest)
        lines.append(f"{cpu:7.1f} {'':8} {'':7} {'':5}  the other {len(rest)} files")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--most", type=int, default=25, help="files listed (default 25)")
    parser.add_argument("--log", help="keep each test's figures there (default: a temporary file)")
    args = parser.parse_args(argv)
    if args.most < 1:
        parser.error(f"--most must be at least 1, got {args.most}")
    scratch = tempfile.mkdtemp(prefix="suite_cpu_")
    log_path = args.log or os.path.join(scratch, "tests.tsv")
    open(log_path, "w").close()
    # The plugin alone on the path: benchmarks/ holds modules named like the package's.
    shutil.copy(os.path.abspath(__file__), os.path.join(scratch, "suite_cpu.py"))
    env = dict(os.environ)
    env[LOG_ENV] = log_path
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [scratch, env.get("PYTHONPATH")]))
    env["PYTEST_ARGS"] = " ".join(filter(None, [env.get("PYTEST_ARGS"), "-p suite_cpu"]))
    before = _cpu_s(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    status = subprocess.run(["make", "test"], cwd=ROOT, env=env).returncode
    wall_s = time.monotonic() - started
    cpu_s = _cpu_s(resource.RUSAGE_CHILDREN) - before
    files = per_file(read_log(log_path))
    print()
    print(table(files, args.most))
    measured = sum(own + children for own, children, _, _ in files.values())
    print(
        f"\nmake test: {wall_s:.0f} s wall, {cpu_s:.0f} s CPU "
        f"({'passed' if status == 0 else f'exit {status}'}); "
        f"the tests {measured:.0f} s CPU, of it "
        f"{sum(children for _, children, _, _ in files.values()):.0f} s in child processes; "
        f"each test's figures in {log_path}"
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
