"""How long `make test` takes on this tree against an earlier one, side by side.

Run: `python benchmarks/suite_time.py [--base REF] [--head REF] [--rounds N]
[--base-seconds S] [--base-python PATH] [--head-python PATH]`, from the
repository; each round is two whole runs of `make test` (about 8 to 10
minutes each on 2 cores).

The time of the suite moves with the machine's load from one hour to the
next by more than the changes it is meant to judge, so a figure of one run
says little. Each tree, a commit (changes not committed are not measured),
is checked out in a worktree of its own under a temporary directory and
set up as `make test` sets it up (its own `.venv` from its own
`pyproject.toml`, from the interpreter `--base-python` or `--head-python`
names, else the Makefile's), with one difference: the third-party
packages that both trees install are held to the versions the head's
environment resolved (a pip constraints file), so that only the trees (or
the interpreters: `--base HEAD --head HEAD --head-python /usr/bin/python3`)
differ. Runs alternate, the first of each round alternating too (base,
head, head, base, ...). It prints every run's wall-clock and CPU time (of
`make test` and every process it waited for), the medians, the spread, the
median of the paired ratios head / base, and, with `--base-seconds`, what
that ratio makes of a wall-clock time measured for the base at another
time.
"""

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="c7390a5", help="the earlier tree (default c7390a5)")
    parser.add_argument("--head", default="HEAD", help="the tree to judge (default HEAD)")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs (default 2)")
    parser.add_argument(
        "--base-seconds",
        type=float,
        help="a wall-clock time of the base measured elsewhere, to scale by the ratio",
    )
    for name in ("base", "head"):
        parser.add_argument(
            f"--{name}-python",
            help=f"the interpreter the {name}'s .venv is made from (default: the Makefile's PYTHON)",
        )
    parser.add_argument("--keep", action="store_true", help="keep the worktrees and logs")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    for name in ("base", "head"):
        python = getattr(args, f"{name}_python")
        if python and shutil.which(python) is None:
            parser.error(f"--{name}-python {python!r} is not an interpreter found: pass its path")
    return args


def _git(*arguments, cwd=ROOT):
    return subprocess.run(
        ["git", *arguments], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def check_out(ref, directory):
    """A worktree of `ref` at `directory`; returns the commit's short name."""
    try:
        commit = _git("rev-parse", "--short", "--verify", f"{ref}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(
            f"{ref!r} is not a commit of this repository: pass a commit or branch"
        ) from None
    _git("worktree", "add", "--detach", "--force", directory, commit)
    return commit


def set_up(tree, constraints=None, python=None):
    """Builds the tree's `.venv` as `make test` does, from `python` and held to `constraints` when given."""
    env = dict(os.environ)
    if constraints:
        env["PIP_CONSTRAINT"] = constraints
    make = ["make", ".venv/.installed", *([f"PYTHON={python}"] if python else [])]
    subprocess.run(make, cwd=tree, env=env, check=True, capture_output=True)


def freeze(tree, path):
    """Writes the versions of the tree's `.venv` (its own project left out) as pip constraints."""
    listed = subprocess.run(
        [os.path.join(tree, ".venv", "bin", "python"), "-m", "pip", "freeze", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    with open(path, "w") as file:
        file.write(listed)


def run_suite(tree, log_path):
    """Runs `make test` in `tree`; returns (exit status, wall s, CPU s of it and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with open(log_path, "w") as log:
        status = subprocess.run(
            ["make", "test"], cwd=tree, stdout=log, stderr=subprocess.STDOUT
        ).returncode
    wall_s = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return status, wall_s, cpu_s


def failures(log_path):
    """The lines of a `make test` log that name what failed (the log goes with the scratch directory)."""
    with open(log_path, encoding="utf-8", errors="replace") as log:
        return [
            line.rstrip()
            for line in log
            if line.startswith(("FAILED ", "ERROR ", "make test: failed"))
        ]


def spread(values):
    """Half the range over the median."""
    return (max(values) - min(values)) / 2 / statistics.median(values)


def main(argv=None):
    args = parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="suite_time_")
    trees = {name: os.path.join(scratch, name) for name in ("base", "head")}
    try:
        commits = {
            name: check_out(ref, trees[name])
            for name, ref in (("base", args.base), ("head", args.head))
        }
        pythons = {"base": args.base_python, "head": args.head_python}
        named = {
            name: commits[name] + (f" ({pythons[name]})" if pythons[name] else "")
            for name in commits
        }
        print(f"base {named['base']}, head {named['head']}, in {scratch}", flush=True)
        set_up(trees["head"], python=pythons["head"])
        constraints = os.path.join(scratch, "constraints.txt")
        freeze(trees["head"], constraints)
        set_up(trees["base"], constraints, python=pythons["base"])
        runs = {"base": [], "head": []}
        for index in range(args.rounds):
            order = ("base", "head") if index % 2 == 0 else ("head", "base")
            for name in order:
                log_path = os.path.join(scratch, f"{name}_{index + 1}.log")
                status, wall_s, cpu_s = run_suite(trees[name], log_path)
                runs[name].append((wall_s, cpu_s))
                outcome = "passed" if status == 0 else f"FAILED (exit {status}, {log_path})"
                print(
                    f"round {index + 1} {name}: {wall_s:.0f} s wall, {cpu_s:.0f} s CPU, {outcome}",
                    flush=True,
                )
                if status != 0:
                    print("\n".join(f"  {line}" for line in failures(log_path)), flush=True)
        print()
        for name in ("base", "head"):
            walls = [wall for wall, _ in runs[name]]
            cpus = [cpu for _, cpu in runs[name]]
            print(
                f"{name} {named[name]}: {statistics.median(walls):.0f} s wall (±{spread(walls):.0%}), "
                f"{statistics.median(cpus):.0f} s CPU (±{spread(cpus):.0%})"
            )
        ratios = [head[0] / base[0] for base, head in zip(runs["base"], runs["head"])]
        cpu_ratios = [head[1] / base[1] for base, head in zip(runs["base"], runs["head"])]
        ratio = statistics.median(ratios)
        print(
            f"head / base, wall: {ratio:.3f} (pairs {', '.join(f'{r:.3f}' for r in ratios)}); "
            f"CPU: {statistics.median(cpu_ratios):.3f}"
        )
        if args.base_seconds:
            print(
                f"the base's {args.base_seconds:g} s makes {args.base_seconds * ratio:.0f} s for the head"
            )
    finally:
        if args.keep:
            print(f"kept: {scratch}")
        else:
            for tree in trees.values():
                subprocess.run(
                    ["git", "worktree", "remove", "--force", tree], cwd=ROOT, capture_output=True
                )
            shutil.rmtree(scratch, ignore_errors=True)
            subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
