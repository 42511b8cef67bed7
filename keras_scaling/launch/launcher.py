"""Start N local workers of one command, as a group that lives and dies together; no TensorFlow."""

import contextlib
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

    Released before returning: another process could take one before the workers do.

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
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]  # TCP over IPv4
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]


def _check_ports_free(ports, host="127.0.0.1"):
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError as error:
                message = f"port_base={ports[0]} needs ports {ports[0]}-{ports[-1]} free on {host}, but port {port} is not ({error.strerror}); pass another port base, or none to pick free ports"
                raise ValueError(message) from None


def worker_env(
    base_env: Mapping[str, str], ports: Sequence[int], index: int, cpu_devices: int | None = None
) -> dict[str, str]:
    """The environment of worker `index`: a copy of `base_env` plus its cluster settings.

    Sets `TF_CONFIG` (every worker on 127.0.0.1, worker 0 the chief), `KERAS_SCALING_LAUNCHED=1`,
    `KERAS_SCALING_CPU_DEVICES` when `cpu_devices` is given, and `PYTHONUNBUFFERED=1` unless set.

    Args:
        base_env: dict (or `os.environ`), the environment to start from.
        ports: list of int, one port per worker of the cluster.
        index: int, this worker's index in `ports`.
        cpu_devices: int or None, the logical CPUs each worker splits its CPU into.

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
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
    env[LAUNCHED_ENV] = "1"
    if cpu_devices is not None:
        env[CPU_DEVICES_ENV] = str(cpu_devices)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _describe_status(returncode):
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"status {returncode} (killed by {name})"
    if returncode == EXIT_PREEMPTED:
        return f"status {returncode} (preempted: saved a backup to resume from)"
    return f"status {returncode}"


@dataclasses.dataclass
class LaunchResult:
    """How a group of workers ended; a caller usually exits with its `exit_code`.

    Args:
        exit_code: as `launch` returns it.
        returncodes: each worker's return code, by index (negative: the signal that ended it).
        failed_worker: the index of the first worker that failed, or None.
        interrupted: whether the launcher was interrupted (SIGINT or SIGTERM).
        message: one line for the user, empty when all succeeded.
        restarts: how many times the whole job was restarted.

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
        # A session of its own: signals reach the worker's children too, and the
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
        copies = ((self.process.stdout, stdout), (self.process.stderr, stderr))
        prefix = f"[worker {index}] "
        self.threads = [
            threading.Thread(target=_copy_lines, args=(*copy, prefix, write_lock), daemon=True)
            for copy in copies
        ]
        for thread in self.threads:
            thread.start()

    def signal_group(self, signum):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)

    def group_alive(self):
        if self.process.poll() is None:
            return True
        try:
            os.killpg(self.pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return _group_has_live_process(self.pgid)


def _group_has_live_process(pgid):
    """Whether group `pgid` has a non-zombie member (init may reap late); True without /proc."""
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
            line = raw_line.decode("utf-8", errors="replace").removesuffix("\n") + "\n"
            with write_lock:
                try:
                    target.write(prefix + line)
                    target.flush()
                except (BrokenPipeError, ValueError, OSError):
                    output_open = False


@contextlib.contextmanager
def _signals_received():
    """The list of SIGINT and SIGTERM the launcher receives meanwhile (from the main thread only)."""
    received: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda signum, _: received.append(signum))
    try:
        yield received
    finally:
        for signum, handler in previous.items():
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
    """Runs `command` as `num_workers` local workers of one cluster (`TF_CONFIG` on 127.0.0.1), and waits.

    Output lines are prefixed with `[worker i] `. The group lives and dies together: when a
    worker fails, the others get SIGTERM, then SIGKILL after `grace_period_s`; SIGINT and SIGTERM
    to the launcher are passed on (from the main thread only). No worker process is left running
    on return. The signals, exit codes and isolation: docs/guides/multi-worker.md.

    Args:
        command: list of str, the program and its arguments.
        num_workers: int, the number of workers, at least 1.
        cpu_devices: int or None, the logical devices `auto_strategy()` splits each worker's CPU into.
        port_base: int or None, the first of consecutive ports; by default free ports are picked.
        grace_period_s: float, how long a worker has to stop after each signal before the next.
        stdout: file for the workers' prefixed stdout; `sys.stdout` by default.
        stderr: file for the workers' prefixed stderr; `sys.stderr` by default.
        env: dict, the environment the workers' settings are added to; `os.environ` by default.
        max_restarts: int, restarts of the whole job after a worker fails or is preempted
            (not after SIGINT or SIGTERM), each said on `stderr`.
        isolation: str, `"auto"` (a private network namespace with only loopback when the kernel
            allows one, else a warning naming the open ports), `"require"` or `"off"`.

    Returns:
        A `LaunchResult`: `exit_code` 0 when every worker succeeded, else the first failed
        worker's status (128 + N for signal N), 130 after Ctrl-C, 143 after SIGTERM, or 75 when
        every worker then exited with 75 (`BackupAndRestore`'s preemption).

    Raises:
        TypeError, ValueError: an argument is invalid, the command cannot be started (no worker
            is left running then), or `isolation` is `"require"` and no namespace can be created.

    Example:

    ```python
    from keras_scaling import launcher
    result = launcher.launch(["python", "train.py"], num_workers=2, cpu_devices=2)
    print(result.exit_code, result.message)
    ```
    """
    if isinstance(command, (str, bytes)) or not command:
        message = f"command must be a non-empty list of strings (the program and its arguments), got {command!r}"
        raise ValueError(message)
    num_workers = _validation.positive_int(num_workers, "num_workers")
    cpu_devices = _validation.optional_positive_int(cpu_devices, "cpu_devices")
    port_base = _validation.optional_positive_int(port_base, "port_base")
    if port_base is not None and port_base + num_workers - 1 > 65535:
        message = f"port_base={port_base} leaves no room for {num_workers} ports below 65536; pass a smaller port base"
        raise ValueError(message)
    grace_period_s = _validation.non_negative_number(
        grace_period_s, "grace_period_s", unit="seconds"
    )
    max_restarts = _validation.non_negative_int(
        max_restarts, "max_restarts", fix="Pass 0 to never restart."
    )
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    arguments = (command, num_workers, cpu_devices, port_base, grace_period_s, stdout, stderr)
    restarts = 0
    while True:
        result = _launch_once(*arguments, os.environ if env is None else env, isolation)
        result.restarts = restarts
        if result.exit_code == 0 or result.interrupted or restarts >= max_restarts:
            return result
        restarts += 1
        restart = f"restarting the job (restart {restarts} of {max_restarts})"
        print(f"keras-scaling launch: {result.message}; {restart}", file=stderr, flush=True)


def _launch_once(
    command, num_workers, cpu_devices, port_base, grace_period_s, stdout, stderr, env, isolation
):
    if port_base is None:
        ports = free_ports(num_workers)
    else:
        ports = list(range(port_base, port_base + num_workers))
        _check_ports_free(ports)
    network = _isolation.open_for_job(isolation, ports, env)
    if network.warning:
        print(f"keras-scaling launch: warning: {network.warning}", file=stderr, flush=True)

    workers = []
    with _signals_received() as signals:
        try:
            streams = (stdout, stderr, threading.Lock(), network.preexec_fn)
            for index in range(num_workers):
                settings = worker_env(env, ports, index, cpu_devices)
                workers.append(_Worker(index, list(command), settings, *streams))
        except (OSError, subprocess.SubprocessError) as error:
            # SubprocessError: joining the namespace failed in the child.
            _stop(workers, [signal.SIGKILL], grace_period_s, signals)
            network.close()
            reason = getattr(error, "strerror", None) or error
            raise ValueError(f"command {command[0]!r} cannot be started: {reason}") from None
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


def _supervise(workers, grace_period_s, signals):
    """Waits until all workers succeed, one fails, or a signal arrives."""
    while True:
        if signals:
            first = signals[0]
            # SIGTERM is a preemption notice, passed on as such: the workers
            # save and exit; only SIGKILL is stronger.
            sequence = [first] + ([] if first == signal.SIGTERM else [signal.SIGTERM])
            _stop(workers, sequence + [signal.SIGKILL], grace_period_s, signals)
            name = signal.Signals(first).name
            returncodes = [worker.process.wait() for worker in workers]
            if all(code == EXIT_PREEMPTED for code in returncodes):
                message = f"interrupted by {name}; every worker saved a backup and exited with status {EXIT_PREEMPTED} (preempted)"
                return LaunchResult(EXIT_PREEMPTED, returncodes, interrupted=True, message=message)
            message = f"interrupted by {name}; stopped the workers"
            return LaunchResult(128 + first, returncodes, interrupted=True, message=message)
        returncodes = [worker.process.poll() for worker in workers]
        failed = next((w for w, code in zip(workers, returncodes) if code not in (None, 0)), None)
        if failed is not None:
            if failed.process.returncode == EXIT_PREEMPTED:
                # Its peers saved at the same step and are exiting too.
                _wait(_all_exited, workers, grace_period_s, signals, len(signals))
            running = [worker for worker in workers if worker.process.poll() is None]
            _stop(running, [signal.SIGTERM, signal.SIGKILL], grace_period_s, signals)
            code = failed.process.returncode
            message = f"worker {failed.index} exited with {_describe_status(code)}"
            if running:
                message += "; stopped the others"
            exit_code = 128 - code if code < 0 else code  # as a shell: 128 + N for signal N
            returncodes = [worker.process.wait() for worker in workers]
            return LaunchResult(exit_code, returncodes, failed_worker=failed.index, message=message)
        if all(code == 0 for code in returncodes):
            return LaunchResult(exit_code=0, returncodes=returncodes)
        time.sleep(_POLL_INTERVAL_S)


def _wait(condition, workers, timeout_s, signals=None, since=0):
    """Polls `condition(workers)` for `timeout_s`: True once it holds; False then or on a new signal (a second Ctrl-C)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if signals is not None and len(signals) > since:
            return False
        if condition(workers):
            return True
        time.sleep(_POLL_INTERVAL_S)
    return False


def _all_exited(workers):
    return all(worker.process.poll() is not None for worker in workers)


def _all_gone(workers):
    for worker in workers:
        worker.process.poll()  # reaps it
    return not any(worker.group_alive() for worker in workers)


def _stop(workers, signal_sequence, grace_period_s, signals):
    """Sends each signal in turn to the workers' groups, `grace_period_s` apart."""
    received_before = len(signals)
    for position, signum in enumerate(signal_sequence):
        alive = [worker for worker in workers if worker.group_alive()]
        if not alive:
            return
        for worker in alive:
            worker.signal_group(signum)
        last = position == len(signal_sequence) - 1
        if not last and _wait(_all_gone, alive, grace_period_s, signals, received_before):
            return
    # After SIGKILL, wait (briefly) for the kernel to remove the processes.
    _wait(_all_gone, workers, 5.0)
