"""`keras-scaling launch`: SIGTERM as a preemption notice, and `--max-restarts`."""

import argparse
import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from keras_scaling.cli import launch as launch_cli
from keras_scaling.launch import launcher

pytestmark = pytest.mark.timeout(90)

EXIT_PREEMPTED = 75

# A worker that records its pid in `DIR/worker{i}` (DIR is argv[1]), then runs a body.
PRELUDE = """
import json, os, signal, sys, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
directory = sys.argv[1]
attempt = len([n for n in os.listdir(directory) if n.startswith(f"attempt{index}-")])
open(os.path.join(directory, f"attempt{index}-{attempt}"), "w").close()
with open(os.path.join(directory, f"worker{index}"), "w") as file:
    file.write(str(os.getpid()))
"""


def worker(body, directory):
    return [sys.executable, "-c", PRELUDE + textwrap.dedent(body), str(directory)]


def run_launch(command, **kwargs):
    stdout, stderr = io.StringIO(), io.StringIO()
    kwargs.setdefault("grace_period_s", 5.0)
    result = launcher.launch(command, 2, stdout=stdout, stderr=stderr, **kwargs)
    return result, stdout.getvalue(), stderr.getvalue()


def wait_for_pids(directory, count=2, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    paths = [os.path.join(directory, f"worker{index}") for index in range(count)]
    while time.monotonic() < deadline:
        if all(os.path.exists(path) and open(path).read().strip() for path in paths):
            return
        time.sleep(0.05)
    raise AssertionError(f"the workers did not start within {timeout_s} s")


def launch_in_background(command, grace_period_s):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "keras_scaling",
            "launch",
            "--workers",
            "2",
            "--grace-period",
            str(grace_period_s),
            "--",
            *command,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigterm_to_launch_reaches_every_worker_as_sigterm_and_75_is_passed_on(tmp_path):
    command = worker(
        """
        def on_sigterm(signum, frame):
            print("saved, preempted", flush=True)
            sys.exit(75)
        signal.signal(signal.SIGTERM, on_sigterm)
        time.sleep(120)
        """,
        tmp_path,
    )
    process = launch_in_background(command, grace_period_s=20)
    try:
        wait_for_pids(tmp_path)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == EXIT_PREEMPTED
    assert sorted(out.splitlines()) == [
        "[worker 0] saved, preempted",
        "[worker 1] saved, preempted",
    ]
    assert "every worker saved a backup and exited with status 75" in err


def test_sigterm_to_launch_is_followed_by_sigkill_after_the_grace_period(tmp_path):
    command = worker(
        """
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(120)
        """,
        tmp_path,
    )
    process = launch_in_background(command, grace_period_s=0.5)
    try:
        wait_for_pids(tmp_path)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 128 + signal.SIGTERM
    assert "interrupted by SIGTERM; stopped the workers" in err


def test_max_restarts_restarts_the_job_after_a_failure_and_says_why(tmp_path):
    command = worker(
        """
        if attempt == 0:
            if index == 1:
                sys.exit(3)
            time.sleep(120)  # until the launcher stops it
        """,
        tmp_path,
    )
    result, _, err = run_launch(command, max_restarts=2)

    assert result.exit_code == 0
    assert result.restarts == 1
    assert err == (
        "keras-scaling launch: worker 1 exited with status 3; stopped the others; "
        "restarting the job (restart 1 of 2)\n"
    )
    assert sorted(name for name in os.listdir(tmp_path) if name.startswith("attempt")) == [
        "attempt0-0",
        "attempt0-1",
        "attempt1-0",
        "attempt1-1",
    ]


def test_max_restarts_gives_up_after_n_restarts_with_the_last_status(tmp_path):
    command = worker("sys.exit(3 if index == 0 else 0)", tmp_path)

    result, _, err = run_launch(command, max_restarts=2)

    assert result.exit_code == 3
    assert result.restarts == 2
    assert err.count("restarting the job") == 2
    assert "(restart 2 of 2)" in err


def test_a_preempted_worker_gives_its_peers_time_to_save_and_exit(tmp_path):
    command = worker(
        """
        if index == 0:
            # Worker 0 saves for longer: it exits once the launcher has seen
            # worker 1 exit and reaped it (its pid is gone).
            while True:
                try:
                    os.kill(int(open(os.path.join(directory, "worker1")).read()), 0)
                except (FileNotFoundError, ValueError):
                    pass  # worker 1 has not written its pid yet
                except ProcessLookupError:
                    break
                time.sleep(0.01)
        sys.exit(75)
        """,
        tmp_path,
    )
    result, _, _ = run_launch(command)

    assert result.returncodes == [EXIT_PREEMPTED, EXIT_PREEMPTED]
    assert result.exit_code == EXIT_PREEMPTED
    assert result.message == (
        "worker 1 exited with status 75 (preempted: saved a backup to resume from)"
    )


def test_max_restarts_restarts_a_preempted_job(tmp_path):
    command = worker("sys.exit(75 if attempt == 0 else 0)", tmp_path)

    result, _, err = run_launch(command, max_restarts=1)

    assert result.exit_code == 0
    assert "status 75 (preempted: saved a backup to resume from)" in err
    assert "restarting the job (restart 1 of 1)" in err


@pytest.mark.parametrize(
    "value, error, fragment",
    [
        (-1, ValueError, "max_restarts must be an integer >= 0, got -1. Pass 0 to never"),
        (1.5, TypeError, "max_restarts must be an integer >= 0, got float 1.5"),
        (True, TypeError, "max_restarts must be an integer >= 0, got bool True"),
    ],
)
def test_max_restarts_must_be_a_non_negative_integer(value, error, fragment):
    with pytest.raises(error, match=fragment):
        launcher.launch([sys.executable, "-c", "pass"], 1, max_restarts=value)


def test_cli_refuses_a_negative_max_restarts(capsys):
    parser = argparse.ArgumentParser(prog="keras-scaling")
    launch_cli.add_parser(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["launch", "--workers", "2", "--max-restarts", "-1", "--", "true"])
    assert "--max-restarts: must be an integer >= 0, got '-1'" in capsys.readouterr().err
