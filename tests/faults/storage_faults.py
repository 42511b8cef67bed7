"""Running a worker where its directory is a small tmpfs or a read-only mount.

Both are made in a private mount namespace (`unshare -m`, as root), so
nothing outside the worker's process sees them and they vanish with it.
"""

import json
import os
import shlex
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "storage_fault_worker.py")
RUN_TIMEOUT_S = 240


def mount_namespaces_unavailable():
    """Why private mounts cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "private mounts need root (unshare -m, mount)"
    probe = subprocess.run(
        ["unshare", "-m", "true"], capture_output=True, text=True, timeout=30, check=False
    )
    if probe.returncode != 0:
        return f"unshare -m is not allowed here: {probe.stderr.strip()}"
    return None


def skip_without_mount_namespaces():
    reason = mount_namespaces_unavailable()
    if reason is not None:
        pytest.skip(reason)


def tmpfs(directory, size):
    """Shell lines mounting a tmpfs of `size` (such as "1m") on `directory`."""
    quoted = shlex.quote(str(directory))
    return f"mkdir -p {quoted} && mount -t tmpfs -o size={size} tmpfs {quoted}"


def read_only(directory):
    """Shell lines making `directory` a read-only bind mount of itself."""
    quoted = shlex.quote(str(directory))
    return (
        f"mkdir -p {quoted} && mount --bind {quoted} {quoted} && mount -o remount,ro,bind {quoted}"
    )


def run_workers(runs):
    """Runs each `(mounts, report, worker arguments)` in turn in one worker, in a private mount
    namespace made with all the mounts (if any); their reports."""
    mounts, arguments = [], [sys.executable, WORKER]
    for number, (run_mounts, report, worker_args) in enumerate(runs):
        mounts += run_mounts
        arguments += ["--then"] * (number > 0) + ["--report", str(report), *map(str, worker_args)]
    if mounts:
        command = shlex.join(arguments)
        arguments = ["unshare", "-m", "sh", "-c", f"{' && '.join(mounts)} && exec {command}"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        arguments,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S * len(runs),
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    reports = []
    for _, report, _ in runs:
        with open(report) as file:
            reports.append(json.load(file))
    return reports
