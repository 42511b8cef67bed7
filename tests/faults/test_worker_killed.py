"""Fault: a worker killed with SIGKILL while the workers run all-reduces.

`keras-scaling launch --workers 2` runs two real `MultiWorkerMirroredStrategy`
workers on 127.0.0.1 that all-reduce back to back. Once both have finished
one all-reduce, the test kills worker 1 with SIGKILL. Worker 0 is then
blocked in an all-reduce its peer will never join, and treats SIGTERM as a
preemption notice (it records it and goes on, as a worker with
`BackupAndRestore` does), so only the launcher's SIGKILL after the grace
period stops it. The launcher must stop it, name the killed worker and exit
non-zero, within its grace period plus a margin for a loaded machine (a
bound on correctness, not a speed claim).
"""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(420)

GRACE_PERIOD_S = 3.0
# What a loaded machine may add to the grace period: the launcher's polling,
# the SIGTERM and SIGKILL, reaping the processes.
MARGIN_S = 30.0
START_TIMEOUT_S = 240.0

WORKER = """
import json
import os
import signal
import sys
import time

out_dir = sys.argv[1]
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
sigterms = []
signal.signal(signal.SIGTERM, lambda signum, frame: sigterms.append(time.time()))

import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()


@tf.function
def all_reduce():
    def replica_fn():
        context = tf.distribute.get_replica_context()
        return context.all_reduce("sum", tf.ones([4096]))

    return strategy.run(replica_fn)


all_reduce()
with open(os.path.join(out_dir, f"worker{index}.ready.partial"), "w") as file:
    file.write(str(os.getpid()))
os.replace(
    os.path.join(out_dir, f"worker{index}.ready.partial"),
    os.path.join(out_dir, f"worker{index}.ready"),
)
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    all_reduce()
"""


def _is_running(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _wait_for_ready(out_dir, launch, timeout_s):
    paths = [os.path.join(out_dir, f"worker{index}.ready") for index in (0, 1)]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(os.path.exists(path) for path in paths):
            return [int(open(path).read()) for path in paths]
        if launch.poll() is not None:
            break
        time.sleep(0.1)
    launch.kill()
    output, _ = launch.communicate(timeout=60)
    pytest.fail(
        f"the workers did not finish a first all-reduce; launch's output:\n{output[-4000:]}"
    )


def test_a_worker_killed_during_all_reduces_stops_the_other_within_the_grace_period(tmp_path):
    script = tmp_path / "all_reduce_worker.py"
    script.write_text(WORKER)
    launch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "keras_scaling",
            "launch",
            "--workers",
            "2",
            "--grace-period",
            str(GRACE_PERIOD_S),
            "--",
            sys.executable,
            str(script),
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    try:
        survivor_pid, victim_pid = _wait_for_ready(tmp_path, launch, START_TIMEOUT_S)

        os.kill(victim_pid, signal.SIGKILL)
        killed_at_s = time.monotonic()
        output, _ = launch.communicate(timeout=GRACE_PERIOD_S + MARGIN_S + 60)
        elapsed_s = time.monotonic() - killed_at_s
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.communicate(timeout=60)

    assert launch.returncode == 128 + signal.SIGKILL, output[-4000:]
    assert "worker 1 exited with status -9 (killed by SIGKILL); stopped the others" in output
    assert elapsed_s < GRACE_PERIOD_S + MARGIN_S, f"launch took {elapsed_s:.1f} s to stop"
    assert not _is_running(survivor_pid)
