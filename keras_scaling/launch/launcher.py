"""Start N local workers of one command, as a group that lives and dies together.

The local counterpart of `torchrun` for `tf.distribute.MultiWorkerMirroredStrategy`:
every worker gets a `TF_CONFIG` naming the whole cluster on free 127.0.0.1
ports, every line it prints is prefixed with its index, and when one worker
fails (or the user presses Ctrl-C) the others are stopped rather than left
blocked in a collective that can never complete. Plain Python: no TensorFlow.
"""

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

from keras_scaling import _validation
from keras_scaling.launch import _isolation
from keras_scaling.launch._environment import CPU_DEVICES_ENV, LAUNCHED_ENV
from keras_scaling.preemption._backup import EXIT_PREEMPTED

__all__ = ["CPU_DEVICES_ENV", "LaunchResult", "free_ports", "launch", "worker_env"]

_POLL_INTERVAL_S = 0.05


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Returns `count` distinct TCP ports that are free on `host` right now.

    All sockets stay bound until every port is chosen, so the ports are
    distinct; they are released before returning, so another process could
    in principle take one before the workers bind it.

    Args:
        count: int, the number of ports.
        host: str, the address to bind, `"127.0.0.1"` by default.

    Returns:
        A list of `count` port numbers.

    Example:

    ```python
    from keras_scaling import launcher
    ports = launcher.free_ports(2)   # such as [41235, 37807]
    ```
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _check_ports_free(ports, host="127.0.0.1"):
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError as error:
                raise ValueError(
                    f"port_base={ports[0]} needs ports {ports[0]}-{ports[-1]} "
                    f"free on {host}, but port {port} is not ({error.strerror}); "
                    "pass another port base, or none to pick free ports"
                ) from None


def _tf_config(ports, index, host="127.0.0.1"):
    """The `TF_CONFIG` of worker `index` in a cluster of workers on `ports`.

    Worker 0 is the chief: with no `chief` task in the cluster,
    `MultiWorkerMirroredStrategy` gives that role to worker 0.

    Args:
        ports: list of int, one port per worker.
        index: int, this worker's index in `ports`.
        host: str, the workers' address, `"127.0.0.1"` by default.

    Returns:
        A dict, such as `{"cluster": {"worker": ["127.0.0.1:5001",
        "127.0.0.1:5002"]}, "task": {"type": "worker", "index": 1}}`.
    """
    return {
        "cluster": {"worker": [f"{host}:{port}" for port in ports]},
        "task": {"type": "worker", "index": index},
    }


def worker_env(
    base_env: Mapping[str, str], ports: Sequence[int], index: int, cpu_devices: int | None = None
) -> dict[str, str]:
    """The environment of worker `index`: `base_env` plus its cluster settings.

    Sets `TF_CONFIG`, `KERAS_SCALING_LAUNCHED=1` (so that
    `keras_scaling.cluster.describe_cluster()` names `launch` as the origin),
    `KERAS_SCALING_CPU_DEVICES` when `cpu_devices` is given, and
    `PYTHONUNBUFFERED=1` (unless already set) so that a Python worker's
    lines reach the terminal as they are printed, not when a buffer fills.

    `TF_CONFIG` names every worker of the cluster on 127.0.0.1, one port
    each, and gives this worker task `{"type": "worker", "index": index}`;
    worker 0 is the chief. `base_env` itself is not changed.

    Args:
        base_env: dict (or `os.environ`), the environment to start from.
        ports: list of int, one port per worker of the cluster.
        index: int, this worker's index in `ports`.
        cpu_devices: int or None, the logical CPUs each worker splits its CPU
            into (`KERAS_SCALING_CPU_DEVICES`); None, the default, leaves it
            unset.

    Returns:
        A new dict.

    Example:

    ```python
    import json, os
    from keras_scaling import launcher
    env = launcher.worker_env(os.environ, launcher.free_ports(2), 0, cpu_devices=2)
    json.loads(env["TF_CONFIG"])["task"]   # {'type': 'worker', 'index': 0}
    env["KERAS_SCALING_CPU_DEVICES"]      # '2'
    ```
    """
    ports = [_validation.positive_int(port, "ports[]") for port in ports]
    index = _validation.non_negative_int(index, "index")
    if index >= len(ports):
        raise ValueError(f"index must be below len(ports) = {len(ports)}, got {index}")
    cpu_devices = _validation.optional_positive_int(cpu_devices, "cpu_devices")
    env = dict(base_env)
    env["TF_CONFIG"] = json.dumps(_tf_config(ports, index))
    env[LAUNCHED_ENV] = "1"
    if cpu_devices is not None:
        env[CPU_DEVICES_ENV] = str(cpu_devices)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _describe_status(returncode):
    """`"status 3"`, or `"status -9 (killed by SIGKILL)"` for a signal.

    Args:
        returncode: int, a `subprocess.Popen.returncode` (negative: the
            signal that ended the process).
    """
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"status {returncode} (killed by {name})"
    if returncode == EXIT_PREEMPTED:
        return f"status {returncode} (preempted: saved a backup to resume from)"
    return f"status {returncode}"


def _exit_code_for(returncode):
    """The launcher's exit status for a worker's: 128 + N for signal N, as a shell does.

    Args:
        returncode: int, a `subprocess.Popen.returncode` (negative: the
            signal that ended the process).
    """
    if returncode < 0:
        return 128 + (-returncode)
    return returncode


@dataclasses.dataclass
class LaunchResult:
    """How a group of workers ended.

    Args:
        exit_code: 0 when every worker succeeded; otherwise the failed
            worker's status (128 + N when signal N killed it), or 130 after
            Ctrl-C.
        returncodes: each worker's own return code, by index (negative: the
            signal that ended it, often the launcher's own when stopping it).
        failed_worker: the index of the first worker that failed, or None.
        interrupted: whether the launcher was interrupted (SIGINT or SIGTERM).
        message: one line for the user, empty when all succeeded.
        restarts: how many times the whole job was restarted
            (`max_restarts`).

    `launch` returns one; a caller usually exits with its `exit_code`.

    Example:

    ```python
    import sys
    from keras_scaling import launcher
    result = launcher.launch([sys.executable, "-c", "pass"], num_workers=2)
    result.exit_code, result.returncodes   # (0, [0, 0])
    ```
    """

    exit_code: int
    returncodes: list[int]
    failed_worker: int | None = None
    interrupted: bool = False
    message: str = ""
    restarts: int = 0


class _Worker:
    """One worker process, in its own session, with threads copying its output."""

    def __init__(self, index, command, env, stdout, stderr, write_lock, preexec_fn=None):
        self.index = index
        # A session of its own makes the worker the leader of a process group
        # that holds its children too, so signals reach all of them; and the
        # terminal's Ctrl-C reaches only the launcher, which forwards it once.
        self.process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec_fn,  # joins the job's network namespace, if any
        )
        self.pgid = self.process.pid
        prefix = f"[worker {index}] "
        self.threads = [
            threading.Thread(
                target=_copy_lines,
                args=(self.process.stdout, stdout, prefix, write_lock),
                daemon=True,
            ),
            threading.Thread(
                target=_copy_lines,
                args=(self.process.stderr, stderr, prefix, write_lock),
                daemon=True,
            ),
        ]
        for thread in self.threads:
            thread.start()

    def poll(self):
        return self.process.poll()

    def signal_group(self, signum):
        """Sends `signum` to the worker and every process it started."""
        try:
            os.killpg(self.pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self):
        """Whether any process of the worker's group is still running."""
        if self.process.poll() is None:
            return True
        try:
            os.killpg(self.pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return _group_has_live_process(self.pgid)


def _group_has_live_process(pgid):
    """Whether process group `pgid` has a member that is not a zombie.

    A worker's orphaned children are reparented to the system's init, which
    may take its time to reap them; a zombie holds no resources, so it does
    not count. Without /proc (not Linux), every member counts.
    """
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                # The command name, in parentheses, may contain spaces.
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, process_group = fields[0], int(fields[2])
        if process_group == pgid and state not in ("Z", "X"):
            return True
    return False


def _copy_lines(pipe, target, prefix, write_lock):
    output_open = True
    with pipe:
        for raw_line in iter(pipe.readline, b""):
            if not output_open:
                continue  # keep draining so the worker never blocks on a full pipe
            line = raw_line.decode("utf-8", errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            with write_lock:
                try:
                    target.write(prefix + line)
                    target.flush()
                except (BrokenPipeError, ValueError, OSError):
                    output_open = False


class _Signals:
    """Records SIGINT and SIGTERM received by the launcher while installed."""

    def __init__(self):
        self.received = []
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._record)
        return self

    def _record(self, signum, frame):
        self.received.append(signum)

    def __exit__(self, *exc_info):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def launch(
    command: Sequence[str],
    num_workers: int,
    cpu_devices: int | None = None,
    port_base: int | None = None,
    grace_period_s: float = 5.0,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    env: Mapping[str, str] | None = None,
    max_restarts: int = 0,
    isolation: str = "auto",
) -> LaunchResult:
    """Runs `command` as `num_workers` local workers of one cluster, and waits.

    Each worker runs `command` with a `TF_CONFIG` naming every worker on
    127.0.0.1 (worker 0 is the chief), so that
    `keras_scaling.auto_strategy()` (or `MultiWorkerMirroredStrategy`) in the
    command joins them into one cluster. Every line a worker prints on stdout
    or stderr is copied to `stdout` or `stderr` prefixed with `[worker i] `.
    Workers read no stdin.

    The group lives and dies together:

    - When a worker fails (non-zero status, or killed by a signal), the
      others get SIGTERM, then SIGKILL after `grace_period_s`: they may be
      blocked in a collective operation that can never complete, so they are
      stopped, not waited for. (TensorFlow's multi-worker runtime takes
      SIGTERM as a preemption notice and keeps running, so it is usually the
      SIGKILL that stops such a worker.)
    - On SIGTERM, the launcher sends SIGTERM to every worker, a preemption
      notice: with `keras_scaling.BackupAndRestore` they save a backup and
      exit with status 75 (`EXIT_PREEMPTED`). SIGKILL follows after
      `grace_period_s`. The launcher then exits with 75 when every worker
      did, else 143.
    - On SIGINT (Ctrl-C), the launcher forwards SIGINT to every worker, then
      sends SIGTERM and finally SIGKILL, each after `grace_period_s`. A
      second Ctrl-C skips the wait.
    - A worker that exits with status 75 (preempted, after saving) gets its
      peers `grace_period_s` to exit by themselves before they are stopped.
    - With `max_restarts`, a job whose worker failed or was preempted is
      started again, all workers anew, up to `max_restarts` times; each
      restart prints why on `stderr`. A job the launcher was told to stop
      (SIGINT, SIGTERM) is not restarted.
    - Signals go to each worker's whole process group, so processes a worker
      started are stopped too, and none is left running when this returns.

    The launcher handles SIGINT and SIGTERM only when called from the main
    thread (Python delivers signals there alone).

    TensorFlow's servers listen on every network interface and authenticate
    nobody. So on Linux, where the kernel allows it (as root, or with
    unprivileged user namespaces), all workers of the job run in one private
    network namespace whose only interface is loopback: they reach each
    other on 127.0.0.1, nothing outside reaches them, and they reach no
    other network. Files, devices, process ids and signals are unchanged.

    Args:
        command: list of str, the program and its arguments.
        num_workers: int, the number of workers, at least 1.
        cpu_devices: int or None, when set each worker's environment gets
            `KERAS_SCALING_CPU_DEVICES=cpu_devices`, which makes
            `keras_scaling.auto_strategy()` split that worker's CPU into that
            many logical devices. Defaults to None (not set).
        port_base: int or None, when set the workers use ports `port_base`,
            `port_base + 1`, ...; by default free ports are picked.
        grace_period_s: float, how long a worker has to stop after each
            signal before the next, stronger one. Defaults to 5.0.
        stdout: file for the workers' prefixed stdout; `sys.stdout` by default.
        stderr: file for the workers' prefixed stderr; `sys.stderr` by default.
        env: dict, the environment the workers' settings are added to;
            `os.environ` by default.
        max_restarts: int, how many times to restart the whole job after a
            worker fails or is preempted. Defaults to 0.
        isolation: str, the workers' network. `"auto"` (default): a private
            network namespace when the kernel allows one; otherwise one
            warning on `stderr` naming the ports open on every interface.
            `"require"`: refuse to start without one (ValueError).
            `"off"`: no namespace (to reach the workers over the network, for
            a debugger or profiler), with the same warning.

    Returns:
        A `LaunchResult`: `exit_code` is 0 when every worker succeeded, the
        first failed worker's status otherwise (128 + N for signal N), 130
        after Ctrl-C, 143 after SIGTERM (75 when every worker then saved and
        exited with 75); `message` says which worker failed and how.

    Raises:
        TypeError, ValueError: an argument is invalid, the command cannot
            be started (no worker is left running then), or `isolation` is
            `"require"` and no private network namespace can be created.

    Example:

    ```python
    from keras_scaling import launcher
    result = launcher.launch(["python", "train.py"], num_workers=2, cpu_devices=2)
    print(result.exit_code, result.message)
    ```
    """
    num_workers, cpu_devices, port_base, grace_period_s = _check_arguments(
        command, num_workers, cpu_devices, port_base, grace_period_s
    )
    max_restarts = _validation.non_negative_int(
        max_restarts, "max_restarts", fix="Pass 0 to never restart."
    )
    stderr = sys.stderr if stderr is None else stderr
    restarts = 0
    while True:
        result = _launch_once(
            command,
            num_workers,
            cpu_devices,
            port_base,
            grace_period_s,
            stdout,
            stderr,
            env,
            isolation,
        )
        result.restarts = restarts
        if result.exit_code == 0 or result.interrupted or restarts >= max_restarts:
            return result
        restarts += 1
        print(
            f"keras-scaling launch: {result.message}; restarting the job "
            f"(restart {restarts} of {max_restarts})",
            file=stderr,
            flush=True,
        )


def _launch_once(
    command,
    num_workers,
    cpu_devices,
    port_base,
    grace_period_s,
    stdout,
    stderr,
    env,
    isolation,
):
    """Runs the workers once, as `launch` describes; returns a `LaunchResult`."""
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    env = os.environ if env is None else env
    if port_base is None:
        ports = free_ports(num_workers)
    else:
        ports = list(range(port_base, port_base + num_workers))
        _check_ports_free(ports)
    network = _isolation.open_for_job(isolation, ports, env)
    if network.warning:
        stderr.write(f"keras-scaling launch: warning: {network.warning}\n")
        stderr.flush()

    write_lock = threading.Lock()
    workers = []
    with _Signals() as signals:
        try:
            for index in range(num_workers):
                workers.append(
                    _Worker(
                        index,
                        list(command),
                        worker_env(env, ports, index, cpu_devices),
                        stdout,
                        stderr,
                        write_lock,
                        network.preexec_fn,
                    )
                )
        except (OSError, subprocess.SubprocessError) as error:
            # SubprocessError: joining the network namespace failed in the child.
            _stop(workers, [signal.SIGKILL], grace_period_s, signals)
            network.close()
            raise ValueError(
                f"command {command[0]!r} cannot be started: "
                f"{getattr(error, 'strerror', None) or error}"
            ) from None
        try:
            result = _supervise(workers, grace_period_s, signals)
        finally:
            # Processes a successful worker left behind are stopped too.
            _stop(workers, [signal.SIGTERM, signal.SIGKILL], grace_period_s, signals)
            for worker in workers:
                worker.process.wait()
                for thread in worker.threads:
                    thread.join(timeout=grace_period_s)
            network.close()
    return result


def _check_arguments(command, num_workers, cpu_devices, port_base, grace_period_s):
    if isinstance(command, (str, bytes)) or not command:
        raise ValueError(
            f"command must be a non-empty list of strings (the program and its "
            f"arguments), got {command!r}"
        )
    num_workers = _validation.positive_int(num_workers, "num_workers")
    cpu_devices = _validation.optional_positive_int(cpu_devices, "cpu_devices")
    port_base = _validation.optional_positive_int(port_base, "port_base")
    if port_base is not None and port_base + num_workers - 1 > 65535:
        raise ValueError(
            f"port_base={port_base} leaves no room for {num_workers} ports below "
            "65536; pass a smaller port base"
        )
    grace_period_s = _validation.non_negative_number(
        grace_period_s, "grace_period_s", unit="seconds"
    )
    return num_workers, cpu_devices, port_base, grace_period_s


def _supervise(workers, grace_period_s, signals):
    """Waits until all workers succeed, one fails, or a signal arrives."""
    while True:
        if signals.received:
            first = signals.received[0]
            # SIGTERM is a preemption notice, passed on as such: the workers
            # save and exit; only SIGKILL is stronger.
            sequence = [first] + ([] if first == signal.SIGTERM else [signal.SIGTERM])
            _stop(workers, sequence + [signal.SIGKILL], grace_period_s, signals)
            name = signal.Signals(first).name
            returncodes = [worker.process.wait() for worker in workers]
            if all(code == EXIT_PREEMPTED for code in returncodes):
                return LaunchResult(
                    exit_code=EXIT_PREEMPTED,
                    returncodes=returncodes,
                    interrupted=True,
                    message=f"interrupted by {name}; every worker saved a backup "
                    f"and exited with status {EXIT_PREEMPTED} (preempted)",
                )
            return LaunchResult(
                exit_code=128 + first,
                returncodes=returncodes,
                interrupted=True,
                message=f"interrupted by {name}; stopped the workers",
            )
        returncodes = [worker.poll() for worker in workers]
        failed = next(
            (
                worker
                for worker, code in zip(workers, returncodes)
                if code is not None and code != 0
            ),
            None,
        )
        if failed is not None:
            if failed.process.returncode == EXIT_PREEMPTED:
                # Its peers saved at the same step and are exiting too.
                _wait_for_exit(workers, grace_period_s, signals)
            running = [worker for worker in workers if worker.poll() is None]
            _stop(running, [signal.SIGTERM, signal.SIGKILL], grace_period_s, signals)
            code = failed.process.returncode
            message = f"worker {failed.index} exited with {_describe_status(code)}"
            if running:
                message += "; stopped the others"
            return LaunchResult(
                exit_code=_exit_code_for(code) or 1,
                returncodes=[worker.process.wait() for worker in workers],
                failed_worker=failed.index,
                message=message,
            )
        if all(code == 0 for code in returncodes):
            return LaunchResult(exit_code=0, returncodes=returncodes)
        time.sleep(_POLL_INTERVAL_S)


def _wait_for_exit(workers, timeout_s, signals):
    """Waits up to `timeout_s` for every worker to exit, or for a signal."""
    received_before = len(signals.received)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(signals.received) == received_before:
        if all(worker.poll() is not None for worker in workers):
            return
        time.sleep(_POLL_INTERVAL_S)


def _stop(workers, signal_sequence, grace_period_s, signals):
    """Sends each signal in turn to the workers' groups until none is left.

    Waits up to `grace_period_s` after each signal but the last; a signal
    received by the launcher meanwhile (a second Ctrl-C) skips the wait.
    """
    received_before = len(signals.received)
    for position, signum in enumerate(signal_sequence):
        alive = [worker for worker in workers if worker.group_alive()]
        if not alive:
            return
        for worker in alive:
            worker.signal_group(signum)
        if position == len(signal_sequence) - 1:
            break
        deadline = time.monotonic() + grace_period_s
        while time.monotonic() < deadline:
            if len(signals.received) > received_before:
                break  # asked again: stop waiting, go on to the stronger signal
            _reap(alive)
            if not any(worker.group_alive() for worker in alive):
                return
            time.sleep(_POLL_INTERVAL_S)
    # After SIGKILL, wait (briefly) for the kernel to remove the processes.
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        _reap(workers)
        if not any(worker.group_alive() for worker in workers):
            return
        time.sleep(_POLL_INTERVAL_S)


def _reap(workers):
    for worker in workers:
        worker.poll()
