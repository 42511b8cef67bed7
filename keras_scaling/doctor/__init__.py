"""`keras-scaling doctor`: check a cluster the way training will use it (docs/guides/doctor.md)."""

import dataclasses
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from keras_scaling.doctor import _checks
from keras_scaling.doctor._checks import Check

if TYPE_CHECKING:
    import tensorflow as tf

    from keras_scaling.devices import StrategyInfo

__all__ = ["Check", "DoctorReport", "run_checks"]

_KNOWN_VALUES = 1024  # elements of the known-value all-reduce: enough to see a partial corruption
# The strategy is built once every worker joined, so reports come within seconds.
_REPORT_WAIT_S = 300.0
_SHOWN_ADDRESSES = 4


@dataclasses.dataclass(frozen=True)
class DoctorReport:
    """What `run_checks` found on this worker; every worker gets the same verdicts.

    Args:
        strategy_info: the `keras_scaling.StrategyInfo` of the strategy checked.
        checks: the `Check`s, in the order they ran.

    Example:

    ```python
    from keras_scaling.doctor import run_checks
    report = run_checks(size_mb=1, out=None)
    report.ok                  # True: every check passed
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
    this = f"{task.get('type', '?')} {task.get('index', '?')}"
    return f"TF_CONFIG is set: {len(addresses)} worker address(es) ({shown}); this task is {this}"


def _own_port(strategy: "tf.distribute.Strategy", num_workers: int) -> tuple:
    """This worker's host:port and port in the strategy's cluster; `(None, None)` without a server."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if num_workers < 2 or resolver is None:
        return None, None
    try:
        address = str(resolver.cluster_spec().task_address(resolver.task_type, resolver.task_id))
        return address, int(address.rsplit(":", 1)[1])
    except (AttributeError, TypeError, ValueError, IndexError):
        return None, None


def _listening(port: int) -> list[str]:
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(name):
            with open(name, encoding="ascii") as file:
                found += _checks.listening_addresses(file.read(), port)
    return found


def _interfaces() -> list[str]:
    try:
        return os.listdir("/sys/class/net")
    except OSError:
        return [name for _, name in socket.if_nameindex()]


def run_checks(
    strategy: "tf.distribute.Strategy | None" = None,
    *,
    size_mb: float = _checks.RESNET50_GRADIENT_MB,
    rounds: int = 3,
    out: TextIO | None = sys.stdout,
) -> DoctorReport:
    """Checks the cluster this process belongs to, and prints what was found.

    Call it on every worker, as training would be: a worker that does not makes the others
    wait (5 minutes at most). Workers whose devices differ fail `devices` and run no collective.

    Args:
        strategy: the `tf.distribute.Strategy`; default `keras_scaling.auto_strategy()`, built here.
        size_mb: float, MB (10^6 bytes) of the float32 tensor whose all-reduce is timed;
            default 102.2, ResNet50's gradients; 1 at least for MB/s.
        rounds: int, timed all-reduces of that tensor (the median is shown).
        out: a text stream to print to as the checks run, or None for silence.

    Returns:
        A `DoctorReport`; `report.ok` is False when a check failed.

    Raises:
        TypeError, ValueError: `size_mb` is not a positive number, or `rounds` not a positive integer.

    Example:

    ```python
    import keras_scaling
    from keras_scaling.doctor import run_checks
    report = run_checks(keras_scaling.auto_strategy(), size_mb=1, rounds=1)
    if not report.ok:
        raise SystemExit(1)
    ```
    """
    # Here: `import keras_scaling.doctor` must leave TensorFlow's devices uninitialised.
    import keras_scaling
    from keras_scaling import _validation, cluster, devices
    from keras_scaling.doctor import _collectives
    from keras_scaling.internals import _versions

    size_mb = _validation.positive_number(
        size_mb, "size_mb", unit="MB", fix="Pass one such as 102.2."
    )
    rounds = _validation.positive_int(rounds, "rounds", fix="Pass a count such as 3.")

    def say(text: str) -> None:
        if out is not None:
            print(text, file=out, flush=True)

    started, host = time.perf_counter(), socket.gethostname()
    # Printed first: building a multi-worker strategy waits for every worker.
    say(f"keras-scaling doctor on {host} (pid {os.getpid()})")
    say(f"cluster: {cluster.describe_cluster()}\ncluster: {_tf_config_line(devices.tf_config())}")
    if strategy is None:
        say("strategy: building it with keras_scaling.auto_strategy() (joins the other workers)")
        strategy = devices.auto_strategy()
    built_s = time.perf_counter() - started
    info = devices.describe_strategy(strategy)
    say(f"strategy: {info}")
    replicas = f"{info.num_replicas} in all, {info.replicas_per_worker} per worker"
    say(f"this is worker {info.worker_index} of {info.num_workers}; replicas: {replicas}")

    checks = []

    def record(check: Check) -> None:
        checks.append(check)
        say(str(check))

    address, port = _own_port(strategy, info.num_workers)
    versions = (keras_scaling.__version__, _versions.tf_version(), _versions.keras_version())
    report = {
        "worker": info.worker_index,
        "host": host,
        "address": address,
        "pid": os.getpid(),
        "versions": _checks.local_versions(*versions),
        "devices": list(info.local_devices),
        "device_kind": info.device_kind,
    }
    reports = _collectives.exchange_reports(strategy, report, info.num_workers, _REPORT_WAIT_S)
    record(_checks.compare_versions(reports, info.num_workers))
    record(_checks.compare_devices(reports, info.num_workers))
    if checks[-1].ok:
        known = _collectives.all_reduce_known_values(strategy, _KNOWN_VALUES)
        record(_checks.check_all_reduce(known, info.num_replicas))
        first_s = time.perf_counter() - started
        message = f"completed {first_s:.2f} s after the start ({built_s:.2f} s of it building the strategy)"
        record(Check("first collective", True, message))
        num_floats = max(1, round(size_mb * _checks.BYTES_PER_MB / _checks.BYTES_PER_FLOAT32))
        timed = info.num_replicas > 1
        seconds = _collectives.time_all_reduce(strategy, num_floats, rounds) if timed else []
        size_bytes = num_floats * _checks.BYTES_PER_FLOAT32
        record(_checks.bandwidth_check(size_bytes, seconds, num_replicas=info.num_replicas))
    else:
        say("not run: all-reduce, first collective, bandwidth (they would wait forever)")
    record(_checks.server_exposure_check(port, _listening(port) if port else [], _interfaces()))
    result = DoctorReport(strategy_info=info, checks=tuple(checks))
    failed = ", ".join(check.name for check in result.failures)
    verdict = f"FAILED: {failed}" if failed else f"all {len(checks)} checks passed"
    say(f"keras-scaling doctor: {verdict}")
    return result
