"""`keras-scaling launch` runs a job's workers in a private network namespace.

The listening sockets of a network namespace are in `/proc/PID/net/tcp` and
`tcp6` of any process in it: the test's own (`/proc/self/net`) shows the
host's, a worker's shows the job's. `KERAS_SCALING_TEST_UNSHARE_ERRNO=EPERM`
makes the namespace call fail as a kernel that forbids it does.
"""

import io
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest

from keras_scaling.launch import _isolation, launcher

pytestmark = pytest.mark.timeout(60)

HERE = pathlib.Path(__file__).parent
REPO = HERE.parent
FORBIDDEN = {_isolation.FAKE_ERRNO_ENV: "EPERM"}
_TCP_LISTEN = "0A"


def namespaces_unavailable():
    """Why this system gives no private network namespace, or "" when it does."""
    try:
        _isolation.create().close()
    except _isolation.Unavailable as failure:
        return str(failure)
    return ""


needs_namespaces = pytest.mark.skipif(
    bool(namespaces_unavailable()), reason="no private network namespace here"
)


def listening_ports(net_dir="/proc/self/net"):
    """The TCP ports (IPv4 and IPv6) in LISTEN state in the namespace of `net_dir`."""
    ports = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = pathlib.Path(net_dir, name).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local_address, state = fields[1], fields[3]
            if state == _TCP_LISTEN:
                ports.add(int(local_address.rsplit(":", 1)[1], 16))
    return ports


def own_namespace():
    return os.readlink("/proc/self/ns/net")


def python(code):
    return [sys.executable, "-c", textwrap.dedent(code)]


PRINT_TF_CONFIG = python("import os; print(os.environ['TF_CONFIG'])")
PRINT_NAMESPACE = python("import os; print(os.readlink('/proc/self/ns/net'))")


def run_launch(command, num_workers=2, env=None, **kwargs):
    stdout, stderr = io.StringIO(), io.StringIO()
    result = launcher.launch(
        command,
        num_workers,
        stdout=stdout,
        stderr=stderr,
        env=dict(os.environ, **(env or {})),
        grace_period_s=2.0,
        **kwargs,
    )
    return result, stdout.getvalue(), stderr.getvalue()


def run_cli(args, env=None, timeout_s=50):
    process = subprocess.run(
        [sys.executable, "-m", "keras_scaling", "launch", *args],
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return process.returncode, process.stdout, process.stderr


def by_worker(out):
    """`{i: payload}` from the `[worker i] payload` lines of `out`."""
    lines = {}
    for line in out.splitlines():
        prefix, _, payload = line.partition("] ")
        lines[int(prefix.removeprefix("[worker "))] = payload
    return lines


def wait_for(paths, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(path.exists() and path.read_text().strip() for path in paths):
            return [int(path.read_text()) for path in paths]
        time.sleep(0.05)
    raise AssertionError(f"the workers did not write {paths} within {timeout_s} s")


class Look:
    """What a launched job showed while its workers waited: its ports, and who listens."""

    def __init__(self, out_dir, timeout_s):
        pids = wait_for([out_dir / "ready0", out_dir / "ready1"], timeout_s)
        self.ports = set(json.loads((out_dir / "ports0").read_text()))
        self.inside = listening_ports(f"/proc/{pids[0]}/net")
        self.host = listening_ports()


def launch_and_look(worker_command, out_dir, timeout_s):
    """Launches 2 workers of `worker_command` and looks while they wait.

    Each worker writes `ports{i}` and `ready{i}` (its pid) to `out_dir`,
    then waits for `out_dir/go`, which is written once the ports are read.

    Returns:
        (the `Look`, the launcher's exit status, its stdout, its stderr).
    """
    process = subprocess.Popen(
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
            *worker_command,
            str(out_dir),
        ],
        cwd=REPO,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        look = Look(out_dir, timeout_s)
        (out_dir / "go").write_text("go")
        out, err = process.communicate(timeout=timeout_s)
    finally:
        process.kill()
        process.wait()
    return look, process.returncode, out, err


# Each worker listens on its TF_CONFIG port on every interface, as
# TensorFlow's server does; worker 1 connects to worker 0 on 127.0.0.1.
LISTENING_WORKER = """
import json, os, pathlib, socket, sys, time
config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
ports = [int(address.rsplit(":", 1)[1]) for address in config["cluster"]["worker"]]
out_dir = pathlib.Path(sys.argv[1])
server = socket.socket(socket.AF_INET6)
server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
server.bind(("::", ports[index]))
server.listen()
(out_dir / f"ports{index}").write_text(json.dumps(ports))
(out_dir / f"ready{index}").write_text(str(os.getpid()))
while not (out_dir / "go").exists():
    time.sleep(0.05)
if index == 0:
    connection, _ = server.accept()
    print("received", connection.recv(100).decode(), flush=True)
else:
    with socket.create_connection(("127.0.0.1", ports[0]), timeout=10) as client:
        client.sendall(b"hello from worker 1")
    print("sent", flush=True)
"""


@needs_namespaces
def test_no_worker_port_listens_in_the_host_namespace_while_the_job_runs(tmp_path):
    look, returncode, out, err = launch_and_look(python(LISTENING_WORKER), tmp_path, timeout_s=30)
    assert look.inside == look.ports, f"the workers listen on {look.inside} inside"
    assert not look.ports & look.host, f"{look.ports & look.host} listen in the host"
    assert returncode == 0, err
    assert by_worker(out) == {0: "received hello from worker 1", 1: "sent"}
    assert "warning" not in err


@needs_namespaces
def test_all_workers_of_a_job_share_one_namespace_apart_from_the_host():
    result, out, _ = run_launch(PRINT_NAMESPACE, num_workers=3)
    assert result.exit_code == 0
    namespaces = set(by_worker(out).values())
    assert len(namespaces) == 1
    assert namespaces != {own_namespace()}


@needs_namespaces
def test_the_workers_keep_their_user_and_see_only_loopback():
    result, out, _ = run_launch(
        python(
            """
            import os, socket
            interfaces = sorted(name for _, name in socket.if_nameindex())
            print(os.getuid(), os.getgid(), interfaces)
            """
        ),
        num_workers=1,
    )
    assert result.exit_code == 0
    assert by_worker(out) == {0: f"{os.getuid()} {os.getgid()} ['lo']"}


@needs_namespaces
def test_the_user_namespace_path_keeps_the_users_ids_and_brings_loopback_up():
    namespace = _isolation.create(user_namespace=True)
    try:
        child = subprocess.run(
            python(
                """
                import os, socket
                server = socket.create_server(("127.0.0.1", 0))
                socket.create_connection(server.getsockname(), timeout=5).close()
                print(os.getuid(), os.getgid(), os.readlink("/proc/self/ns/user"),
                      os.readlink("/proc/self/ns/net"))
                """
            ),
            preexec_fn=namespace.enter,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        namespace.close()
    assert child.returncode == 0, child.stderr
    uid, gid, user_namespace, network_namespace = child.stdout.split()
    assert (int(uid), int(gid)) == (os.getuid(), os.getgid())
    assert user_namespace != os.readlink("/proc/self/ns/user")
    assert network_namespace != own_namespace()


def worker_ports(out):
    """The ports of the `TF_CONFIG` that worker 0 printed in `out`."""
    config = json.loads(by_worker(out)[0])
    return [int(address.rsplit(":", 1)[1]) for address in config["cluster"]["worker"]]


def test_auto_without_namespaces_warns_once_naming_the_ports_and_runs():
    result, out, err = run_launch(PRINT_TF_CONFIG, env=FORBIDDEN)
    assert result.exit_code == 0
    ports = worker_ports(out)
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1, err
    assert "no private network namespace" in warnings[0]
    assert "EPERM" in warnings[0]
    assert f"ports {ports[0]}, {ports[1]}" in warnings[0]


def test_auto_without_namespaces_runs_the_workers_in_the_host_namespace():
    result, out, _ = run_launch(PRINT_NAMESPACE, env=FORBIDDEN)
    assert result.exit_code == 0
    assert set(by_worker(out).values()) == {own_namespace()}


def test_require_without_namespaces_exits_2_and_starts_no_worker(tmp_path):
    marker = tmp_path / "started"
    returncode, out, err = run_cli(
        ["--workers", "2", "--isolation", "require", "--"]
        + python(f"open({str(marker)!r}, 'w').close()"),
        env=FORBIDDEN,
    )
    assert returncode == 2
    assert out == ""
    assert err.startswith(
        "keras-scaling launch: isolation is 'require', but the workers cannot "
        "get a private network namespace: unshare(CLONE_NEWNET"
    )
    assert "EPERM (Operation not permitted)" in err
    assert not marker.exists()


@needs_namespaces
def test_require_with_namespaces_runs_the_job_quietly():
    returncode, out, err = run_cli(
        ["--workers", "2", "--isolation", "require", "--"] + PRINT_NAMESPACE
    )
    assert returncode == 0
    assert err == ""
    assert own_namespace() not in out


def test_off_runs_the_workers_in_the_host_namespace():
    result, out, _ = run_launch(PRINT_NAMESPACE, isolation="off")
    assert result.exit_code == 0
    assert set(by_worker(out).values()) == {own_namespace()}


def test_off_warns_once_naming_the_ports():
    result, out, err = run_launch(PRINT_TF_CONFIG, isolation="off")
    assert result.exit_code == 0
    first, second = worker_ports(out)
    assert err == (
        "keras-scaling launch: warning: isolation is off: while the job runs, its "
        "workers listen on every network interface on ports "
        f"{first}, {second}, and TensorFlow's servers authenticate nobody. See "
        "Security in the multi-worker guide.\n"
    )


def test_an_unknown_isolation_is_refused_with_the_parameter_name():
    with pytest.raises(
        ValueError, match="isolation must be one of 'auto', 'require', 'off', got 'on'"
    ):
        launcher.launch(python("pass"), 2, isolation="on")


def test_the_cli_refuses_an_unknown_isolation():
    returncode, _, err = run_cli(["--workers", "2", "--isolation", "on", "--", "true"])
    assert returncode == 2
    assert "--isolation: invalid choice: 'on'" in err


def test_kernel_settings_that_forbid_namespaces_are_named():
    hint = _isolation._sysctl_hint(
        {"user.max_user_namespaces": "0", "kernel.apparmor_restrict_unprivileged_userns": "1"}
    )
    assert hint == (
        "; forbidden by user.max_user_namespaces = 0, "
        "kernel.apparmor_restrict_unprivileged_userns = 1"
    )


def test_kernel_settings_that_allow_namespaces_are_not_named():
    assert (
        _isolation._sysctl_hint(
            {"user.max_user_namespaces": "63000", "kernel.unprivileged_userns_clone": "1"}
        )
        == ""
    )


# --- a real TensorFlow job ---------------------------------------------------


@needs_namespaces
@pytest.mark.timeout(300)
def test_a_tensorflow_job_listens_only_in_its_namespace_and_trains(tmp_path):
    look, returncode, _, err = launch_and_look(
        [sys.executable, str(HERE / "workers" / "isolation_worker.py")],
        tmp_path,
        timeout_s=180,
    )
    assert returncode == 0, err[-4000:]
    assert look.ports <= look.inside, f"TensorFlow listens on {look.inside} inside"
    assert not look.ports & look.host, f"{look.ports & look.host} listen in the host"
    workers = [json.loads((tmp_path / f"worker{i}.json").read_text()) for i in (0, 1)]
    assert [worker["replica_sum"] for worker in workers] == [3.0, 3.0]
    assert workers[0]["weights"] == workers[1]["weights"]
    assert workers[0]["losses"][-1] < workers[0]["losses"][0]
