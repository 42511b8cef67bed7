"""`keras-scaling doctor`: check a cluster the way training will use it.

`run_checks()` runs on every worker of a job, started the way training is
started (`keras-scaling launch`, `srun`, a Ray Train loop, or alone). It says
where the cluster came from and what it holds (workers, replicas, devices),
then checks, through the strategy's own collectives:

| check | fails when |
|---|---|
| `versions` | a worker runs another Python, TensorFlow, Keras or keras_scaling (the message names it) |
| `devices` | workers differ in replicas or kind of device (each worker's devices are named); no collective runs then |
| `all-reduce` | the sum of known values over all replicas is not the known sum |
| `first collective` | never: seconds from the start until the first collective completed |
| `bandwidth` | never: all-reduce time and MB/s for a tensor the size of ResNet50's gradients |
| `server` | never: who can reach the job's TensorFlow servers (every interface) |
"""

import dataclasses
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from keras_scaling.doctor._checks import (
    BYTES_PER_FLOAT32,
    BYTES_PER_MB,
    RESNET50_GRADIENT_MB,
    Check,
    bandwidth_check,
    check_all_reduce,
    compare_devices,
    compare_versions,
    listening_addresses,
    local_versions,
    server_exposure_check,
)

if TYPE_CHECKING:
    import tensorflow as tf

    from keras_scaling.devices import StrategyInfo

__all__ = ["Check", "DoctorReport", "run_checks"]

# Elements of the known-value all-reduce: enough to see a partial corruption.
_KNOWN_VALUES = 1024
# How long a worker waits for each other worker's report: the strategy is
# built once every worker joined, so they arrive within seconds.
_REPORT_WAIT_S = 300.0
_SHOWN_ADDRESSES = 4


@dataclasses.dataclass(frozen=True)
class DoctorReport:
    """What `run_checks` found on this worker.

    Every worker of a job gets the same verdicts: the checks compare what
    all workers sent.

    Args:
        strategy_info: the `keras_scaling.StrategyInfo` of the strategy checked.
        checks: the `Check`s, in the order they ran.

    Example:

    ```python
    from keras_scaling.doctor import run_checks
    report = run_checks(size_mb=1, out=None)
    report.ok                  # True: every check passed
    [check.name for check in report.checks]
    ```
    """

    strategy_info: "StrategyInfo"
    checks: tuple

    @property
    def ok(self) -> bool:
        """Whether every check passed."""
        return all(check.ok for check in self.checks)

    @property
    def failures(self) -> tuple:
        """The checks that failed."""
        return tuple(check for check in self.checks if not check.ok)

    def __str__(self) -> str:
        return "\n".join(str(check) for check in self.checks)


def _tf_config_line(config: dict[str, Any]) -> str:
    if not config:
        return "TF_CONFIG is not set"
    cluster = config.get("cluster", {})
    addresses = [address for job in ("chief", "worker") for address in cluster.get(job, [])]
    shown = ", ".join(addresses[:_SHOWN_ADDRESSES])
    if len(addresses) > _SHOWN_ADDRESSES:
        shown += f", ... ({len(addresses) - _SHOWN_ADDRESSES} more)"
    task = config.get("task", {})
    return (
        f"TF_CONFIG is set: {len(addresses)} worker address(es) ({shown}); this "
        f"task is {task.get('type', '?')} {task.get('index', '?')}"
    )


def _own_address(strategy: "tf.distribute.Strategy", num_workers: int) -> str | None:
    """This worker's host:port in the strategy's cluster, or None when the job starts no server."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if num_workers < 2 or resolver is None:
        return None
    try:
        return str(resolver.cluster_spec().task_address(resolver.task_type, resolver.task_id))
    except (AttributeError, TypeError, ValueError):
        return None


def _port(address: str | None) -> int | None:
    try:
        return int(address.rsplit(":", 1)[1]) if address else None
    except (IndexError, ValueError):
        return None


def _listening(port: int) -> list[str]:
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name, encoding="ascii") as file:
                found += listening_addresses(file.read(), port)
        except OSError:
            continue
    return found


def _interfaces() -> list[str]:
    try:
        return os.listdir("/sys/class/net")
    except OSError:
        return [name for _, name in socket.if_nameindex()]


def run_checks(
    strategy: "tf.distribute.Strategy | None" = None,
    *,
    size_mb: float = RESNET50_GRADIENT_MB,
    rounds: int = 3,
    out: TextIO | None = sys.stdout,
) -> DoctorReport:
    """Check the cluster this process belongs to, and print what was found.

    Call it on every worker, as training would be called. The workers first
    exchange their versions and devices through the coordination service of
    `MultiWorkerMirroredStrategy`, not a collective: when they disagree on
    their replicas or kind of device, every worker fails the `devices` check
    within seconds, naming each worker's devices, and no collective runs
    (each would wait forever). The other checks are collectives, so a
    worker that does not call it makes the others wait (for its report,
    5 minutes at most). Under `keras-scaling launch`, `srun` or a Ray Train loop, the strategy
    comes from `keras_scaling.auto_strategy()`, which reads `TF_CONFIG`, a
    Slurm job step or a Kubernetes worker list (`keras_scaling.cluster`); the
    first line printed says which.

    Args:
        strategy: the `tf.distribute.Strategy` to check; default
            `keras_scaling.auto_strategy()`, built here (so the time to the
            first collective includes joining the cluster).
        size_mb: float, the size in MB (10^6 bytes) of the float32 tensor
            whose all-reduce is timed; default 102.2, ResNet50's gradients.
            Under 1 MB, or when the median all-reduce takes under 1 ms, the
            `bandwidth` check says it is too small to time instead of giving
            MB/s; with one replica in all it says there is nothing to combine.
        rounds: int, timed all-reduces of that tensor (the median is shown).
        out: a text stream to print to as the checks run, or None for silence.

    Returns:
        A `DoctorReport`; `report.ok` is False when a check failed.

    Raises:
        TypeError: `size_mb` is not a number, or `rounds` not an integer.
        ValueError: `size_mb` is not finite and positive, or `rounds` is below 1.

    Example:

    ```python
    import keras_scaling
    from keras_scaling.doctor import run_checks
    report = run_checks(keras_scaling.auto_strategy(), size_mb=1, rounds=1)
    if not report.ok:
        raise SystemExit(1)
    ```
    """
    # Here, not at the top: `import keras_scaling.doctor` must stay cheap and
    # leave TensorFlow's devices uninitialised.
    import keras_scaling
    from keras_scaling import _validation, cluster, devices
    from keras_scaling.doctor import _collectives
    from keras_scaling.internals import _versions

    size_mb = _validation.positive_number(
        size_mb, "size_mb", unit="MB", fix="Pass the tensor's size in MB, such as 102.2."
    )
    rounds = _validation.positive_int(
        rounds, "rounds", fix="Pass the number of timed all-reduces, such as 3."
    )

    def say(text: str) -> None:
        if out is not None:
            print(text, file=out, flush=True)

    started = time.perf_counter()
    config = devices.tf_config()
    host = socket.gethostname()
    # Printed before the strategy is built: under MultiWorkerMirroredStrategy
    # building it waits until every worker of TF_CONFIG has joined.
    say(f"keras-scaling doctor on {host} (pid {os.getpid()})")
    say(f"cluster: {cluster.describe_cluster()}")
    say(f"cluster: {_tf_config_line(config)}")
    if strategy is None:
        say("strategy: building it with keras_scaling.auto_strategy() (joins the other workers)")
        strategy = devices.auto_strategy()
    built_s = time.perf_counter() - started
    info = devices.describe_strategy(strategy)
    say(f"strategy: {info}")
    say(
        f"this is worker {info.worker_index} of {info.num_workers}; replicas: "
        f"{info.num_replicas} in all, {info.replicas_per_worker} per worker"
    )

    checks = []

    def record(check: Check) -> None:
        checks.append(check)
        say(str(check))

    address = _own_address(strategy, info.num_workers)
    report = {
        "worker": info.worker_index,
        "host": host,
        "address": address,
        "pid": os.getpid(),
        "versions": local_versions(
            keras_scaling.__version__, _versions.tf_version(), _versions.keras_version()
        ),
        "devices": list(info.local_devices),
        "device_kind": info.device_kind,
    }
    reports = _collectives.exchange_reports(strategy, report, info.num_workers, _REPORT_WAIT_S)
    record(compare_versions(reports, info.num_workers))
    record(compare_devices(reports, info.num_workers))
    if checks[-1].ok:
        record(
            check_all_reduce(
                _collectives.all_reduce_known_values(strategy, _KNOWN_VALUES), info.num_replicas
            )
        )
        first_collective_s = time.perf_counter() - started
        record(
            Check(
                "first collective",
                ok=True,
                message=f"completed {first_collective_s:.2f} s after the start "
                f"({built_s:.2f} s of it building the strategy)",
            )
        )
        num_floats = max(1, round(size_mb * BYTES_PER_MB / BYTES_PER_FLOAT32))
        seconds = (
            _collectives.time_all_reduce(strategy, num_floats, rounds)
            if info.num_replicas > 1
            else []
        )
        record(
            bandwidth_check(num_floats * BYTES_PER_FLOAT32, seconds, num_replicas=info.num_replicas)
        )
    else:
        say(
            "not run: all-reduce, first collective, bandwidth (collectives, which would "
            "wait forever for replicas that never come)"
        )
    port = _port(address)
    record(server_exposure_check(port, _listening(port) if port else [], _interfaces()))
    result = DoctorReport(strategy_info=info, checks=tuple(checks))
    if result.ok:
        say(f"keras-scaling doctor: all {len(checks)} checks passed")
    else:
        names = ", ".join(check.name for check in result.failures)
        say(f"keras-scaling doctor: FAILED: {names}")
    return result
