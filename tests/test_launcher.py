"""`keras_scaling.launcher` and `keras-scaling launch`, with plain Python workers."""

import argparse
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from keras_scaling.cli import launch as launch_cli
from keras_scaling.launch import launcher

pytestmark = pytest.mark.timeout(60)


def python(code):
    """A worker command running `code` (dedented) in this interpreter."""
    return [sys.executable, "-c", textwrap.dedent(code)]


def run_launch(command, num_workers=2, **kwargs):
    stdout, stderr = io.StringIO(), io.StringIO()
    kwargs.setdefault("grace_period_s", 2.0)
    result = launcher.launch(command, num_workers, stdout=stdout, stderr=stderr, **kwargs)
    return result, stdout.getvalue(), stderr.getvalue()


def is_running(pid):
    """Whether `pid` is a live process (a zombie, already dead, counts as not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_for_files(paths, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(os.path.exists(path) and open(path).read().strip() for path in paths):
            return [int(open(path).read()) for path in paths]
        time.sleep(0.05)
    raise AssertionError(f"the workers did not write {paths} within {timeout_s} s")


# A worker that records its pid in `pids/worker{i}`, then runs `body`, which
# can wait for files that other workers write there.
WORKER_PRELUDE = """
import json, os, signal, subprocess, sys, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
with open(os.path.join(sys.argv[1], f"worker{index}"), "w") as file:
    file.write(str(os.getpid()))

def wait_for(*names):
    paths = [os.path.join(sys.argv[1], name) for name in names]
    deadline = time.monotonic() + 30
    while not all(os.path.exists(path) and os.path.getsize(path) for path in paths):
        if time.monotonic() > deadline:
            sys.exit(f"worker {index}: no {names} within 30 s")
        time.sleep(0.01)
"""


def worker(body):
    return python(WORKER_PRELUDE + textwrap.dedent(body))


def test_every_output_line_is_prefixed_with_its_worker_index():
    result, out, err = run_launch(
        python(
            """
            import json, os, sys
            index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
            print(f"first line of {index}")
            print(f"second line of {index}")
            sys.stderr.write(f"warning from {index}")  # no final newline
            """
        )
    )
    assert result.exit_code == 0
    assert sorted(out.splitlines()) == [
        "[worker 0] first line of 0",
        "[worker 0] second line of 0",
        "[worker 1] first line of 1",
        "[worker 1] second line of 1",
    ]
    assert sorted(err.splitlines()) == [
        "[worker 0] warning from 0",
        "[worker 1] warning from 1",
    ]


def test_each_worker_gets_the_whole_cluster_in_tf_config_on_distinct_ports():
    result, out, _ = run_launch(python("import os; print(os.environ['TF_CONFIG'])"), num_workers=3)
    assert result.exit_code == 0
    configs = {}
    for line in out.splitlines():
        prefix, _, payload = line.partition("] ")
        configs[int(prefix.removeprefix("[worker "))] = json.loads(payload)
    assert sorted(configs) == [0, 1, 2]
    cluster = configs[0]["cluster"]
    assert list(cluster) == ["worker"]
    hosts = [address.rsplit(":", 1)[0] for address in cluster["worker"]]
    ports = [int(address.rsplit(":", 1)[1]) for address in cluster["worker"]]
    assert hosts == ["127.0.0.1"] * 3
    assert len(set(ports)) == 3
    for index, config in configs.items():
        assert config["cluster"] == cluster
        assert config["task"] == {"type": "worker", "index": index}


def test_free_ports_are_distinct_and_bindable():
    ports = launcher.free_ports(4)
    assert len(set(ports)) == 4
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def consecutive_free_ports(count):
    """A port P such that P, P+1, ... P+count-1 are free on 127.0.0.1 now."""
    for _ in range(50):
        base = launcher.free_ports(1)[0]
        if base + count > 65536:
            continue
        sockets = [socket.socket() for _ in range(count)]
        try:
            for offset, sock in enumerate(sockets):
                sock.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return base
    pytest.skip("found no consecutive free ports on 127.0.0.1")


def test_port_base_gives_consecutive_ports():
    base = consecutive_free_ports(2)
    result, out, _ = run_launch(
        python("import json, os; print(json.loads(os.environ['TF_CONFIG'])['cluster']['worker'])"),
        port_base=base,
    )
    assert result.exit_code == 0
    expected = str([f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"])
    assert sorted(out.splitlines()) == [
        f"[worker 0] {expected}",
        f"[worker 1] {expected}",
    ]


def test_port_base_on_a_busy_port_is_refused_before_starting_workers():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} is not"):
            launcher.launch(python("print('started')"), 2, port_base=port)


def test_cpu_devices_is_passed_to_every_worker():
    result, out, _ = run_launch(
        python("import os; print(os.environ.get('KERAS_SCALING_CPU_DEVICES'))"),
        cpu_devices=3,
    )
    assert result.exit_code == 0
    assert sorted(out.splitlines()) == ["[worker 0] 3", "[worker 1] 3"]


def test_without_cpu_devices_the_variable_is_not_set():
    env = {key: value for key, value in os.environ.items()}
    env.pop("KERAS_SCALING_CPU_DEVICES", None)
    result, out, _ = run_launch(
        python("import os; print(os.environ.get('KERAS_SCALING_CPU_DEVICES'))"),
        num_workers=1,
        env=env,
    )
    assert out == "[worker 0] None\n"


def test_a_failed_worker_stops_the_others_and_sets_the_exit_status(tmp_path):
    started = time.monotonic()
    result, _, _ = run_launch(
        worker(
            """
            if index == 1:
                wait_for("worker0")  # fails once worker 0 runs
                sys.exit(3)
            time.sleep(120)
            """
        )
        + [str(tmp_path)]
    )
    elapsed_s = time.monotonic() - started
    assert result.exit_code == 3
    assert result.failed_worker == 1
    assert result.message == "worker 1 exited with status 3; stopped the others"
    assert result.returncodes == [-signal.SIGTERM, 3]
    assert elapsed_s < 60  # worker 0 would sleep 120 s if it were waited for
    assert not is_running(int((tmp_path / "worker0").read_text()))


def test_a_worker_killed_by_a_signal_is_named_with_the_signal(tmp_path):
    result, _, _ = run_launch(
        worker(
            """
            if index == 1:
                wait_for("worker0", "worker2")  # dies once the others run
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(120)
            """
        )
        + [str(tmp_path)],
        num_workers=3,
    )
    assert result.failed_worker == 1
    assert result.exit_code == 128 + signal.SIGKILL
    assert result.message == (
        "worker 1 exited with status -9 (killed by SIGKILL); stopped the others"
    )
    for index in (0, 2):
        assert not is_running(int((tmp_path / f"worker{index}").read_text()))


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    result, _, _ = run_launch(
        worker(
            """
            if index == 1:
                wait_for("ignores0")  # fails once worker 0 ignores SIGTERM
                sys.exit(1)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with open(os.path.join(sys.argv[1], f"ignores{index}"), "w") as file:
                file.write("SIGTERM")
            time.sleep(120)
            """
        )
        + [str(tmp_path)],
        grace_period_s=0.5,
    )
    assert result.failed_worker == 1
    assert result.returncodes == [-signal.SIGKILL, 1]
    assert not is_running(int((tmp_path / "worker0").read_text()))


def test_processes_started_by_workers_are_stopped_too(tmp_path):
    result, _, _ = run_launch(
        worker(
            """
            child = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(120)"])
            with open(os.path.join(sys.argv[1], f"child{index}"), "w") as file:
                file.write(str(child.pid))
            if index == 1:
                # Fails only once worker 0 has started its child too.
                child0 = os.path.join(sys.argv[1], "child0")
                while not (os.path.exists(child0) and os.path.getsize(child0)):
                    time.sleep(0.05)
                sys.exit(2)
            child.wait()
            """
        )
        + [str(tmp_path)]
    )
    assert result.exit_code == 2
    children = [int((tmp_path / f"child{index}").read_text()) for index in (0, 1)]
    assert not any(is_running(pid) for pid in children)


def test_a_successful_run_leaves_no_process_behind(tmp_path):
    result, _, _ = run_launch(
        worker(
            """
            child = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(120)"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(os.path.join(sys.argv[1], f"child{index}"), "w") as file:
                file.write(str(child.pid))
            """
        )
        + [str(tmp_path)]
    )
    assert result.exit_code == 0
    children = [int((tmp_path / f"child{index}").read_text()) for index in (0, 1)]
    assert not any(is_running(pid) for pid in children)


def test_a_command_that_cannot_start_is_a_value_error():
    with pytest.raises(ValueError, match="no-such-program-here"):
        launcher.launch(["no-such-program-here"], 2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"command": [], "num_workers": 2}, "command must be a non-empty list"),
        ({"command": "python x.py", "num_workers": 2}, "command must be"),
        ({"command": ["true"], "num_workers": 0}, "num_workers must be a positive integer, got 0"),
        ({"command": ["true"], "num_workers": 2, "cpu_devices": 0}, "cpu_devices"),
        ({"command": ["true"], "num_workers": 2, "port_base": 65535}, "port_base"),
    ],
)
def test_invalid_arguments_are_refused_with_the_parameter_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        launcher.launch(**kwargs)


def launch_parser():
    parser = argparse.ArgumentParser(prog="keras-scaling")
    launch_cli.add_parser(parser.add_subparsers())
    return parser


def test_cli_runs_the_command_after_the_double_dash(capfd):
    args = launch_parser().parse_args(
        ["launch", "--workers", "2", "--cpu-devices", "2", "--"]
        + python("import os, sys; print(sys.argv[1:], os.environ['KERAS_SCALING_CPU_DEVICES'])")
        + ["--workers", "7"]
    )
    assert args.run(args) == 0
    out = capfd.readouterr().out
    assert sorted(out.splitlines()) == [
        "[worker 0] ['--workers', '7'] 2",
        "[worker 1] ['--workers', '7'] 2",
    ]


def test_cli_reports_the_failed_worker_on_stderr(capfd):
    args = launch_parser().parse_args(
        ["launch", "--workers", "2", "--"]
        + python(
            "import json, os, sys; "
            "sys.exit(5 if json.loads(os.environ['TF_CONFIG'])['task']['index'] else 0)"
        )
    )
    assert args.run(args) == 5
    err = capfd.readouterr().err
    assert "keras-scaling launch: worker 1 exited with status 5" in err


def test_cli_without_a_command_exits_2_with_a_message(capfd):
    args = launch_parser().parse_args(["launch", "--workers", "2"])
    assert args.run(args) == 2
    assert "no command given" in capfd.readouterr().err


def test_cli_refuses_a_non_positive_worker_count(capsys):
    with pytest.raises(SystemExit) as exit_info:
        launch_parser().parse_args(["launch", "--workers", "0", "--", "true"])
    assert exit_info.value.code == 2
    assert "--workers: must be a positive integer, got '0'" in capsys.readouterr().err


def test_cli_exits_2_when_the_command_cannot_start(capfd):
    args = launch_parser().parse_args(["launch", "--workers", "2", "--", "no-such-program-here"])
    assert args.run(args) == 2
    assert "no-such-program-here" in capfd.readouterr().err


def test_ctrl_c_is_forwarded_to_every_worker_and_nothing_is_left(tmp_path):
    worker_code = WORKER_PRELUDE + textwrap.dedent(
        """
        def on_sigint(signum, frame):
            print("worker got SIGINT", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGINT, on_sigint)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with open(os.path.join(sys.argv[1], f"child{index}"), "w") as file:
            file.write(str(child.pid))
        time.sleep(120)
        """
    )
    launch_process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "keras_scaling",
            "launch",
            "--workers",
            "2",
            "--grace-period",
            "2",
            "--",
            sys.executable,
            "-c",
            worker_code,
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        workers = wait_for_files([tmp_path / "worker0", tmp_path / "worker1"])
        children = wait_for_files([tmp_path / "child0", tmp_path / "child1"])
        launch_process.send_signal(signal.SIGINT)
        out, err = launch_process.communicate(timeout=30)
    finally:
        launch_process.kill()
        launch_process.wait()
    assert launch_process.returncode == 128 + signal.SIGINT
    assert sorted(out.splitlines()) == [
        "[worker 0] worker got SIGINT",
        "[worker 1] worker got SIGINT",
    ]
    assert "keras-scaling launch: interrupted by SIGINT; stopped the workers" in err
    assert not any(is_running(pid) for pid in workers + children)


def test_a_second_ctrl_c_kills_the_workers_without_waiting(tmp_path):
    worker_code = WORKER_PRELUDE + textwrap.dedent(
        """
        # Like a worker stuck in a collective operation: deaf to both signals,
        # it only notes that SIGINT arrived.
        def on_sigint(signum, frame):
            with open(os.path.join(sys.argv[1], f"sigint{index}"), "w") as file:
                file.write(str(os.getpid()))
        signal.signal(signal.SIGINT, on_sigint)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(120)
        """
    )
    launch_process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "keras_scaling",
            "launch",
            "--workers",
            "2",
            "--grace-period",
            "60",
            "--",
            sys.executable,
            "-c",
            worker_code,
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        workers = wait_for_files([tmp_path / "worker0", tmp_path / "worker1"])
        launch_process.send_signal(signal.SIGINT)
        # The launcher passed the first Ctrl-C on, and now waits out its grace period.
        wait_for_files([tmp_path / "sigint0", tmp_path / "sigint1"])
        launch_process.send_signal(signal.SIGINT)
        # Well within the 60 s grace period it would otherwise wait, twice.
        launch_process.communicate(timeout=30)
    finally:
        launch_process.kill()
        launch_process.wait()
    assert launch_process.returncode == 128 + signal.SIGINT
    assert not any(is_running(pid) for pid in workers)
