"""Workers, replicas and devices of a strategy (no keras_scaling imports: `compat` uses it)."""

import re
from collections.abc import Iterable
from typing import Any

import tensorflow as tf


def _local_devices(strategy: tf.distribute.Strategy) -> tuple[str, ...]:
    try:
        return tuple(strategy.extended.worker_devices)
    except RuntimeError:
        # The default strategy has no device list: it runs where TensorFlow
        # places ops, the first GPU if there is one.
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return (devices[0].name,)


def _device_kind(device_names: Iterable[str]) -> str:
    names = " ".join(device_names).upper()
    return next((kind for kind in ("TPU", "GPU") if f"{kind}:" in names), "CPU")


def _is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """The workers (machines or processes) the strategy spans: the TPU hosts, the cluster's, or 1.

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        int, at least 1.

    Example:

    ```python
    keras_scaling.devices.num_workers(tf.distribute.get_strategy())   # 1
    ```
    """
    if _is_multi_worker(strategy):
        cluster = strategy.cluster_resolver.cluster_spec().as_dict()
        return max(1, sum(len(cluster.get(job, ())) for job in ("chief", "worker")))
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return strategy.extended.num_hosts
    return 1


def worker_index(strategy: tf.distribute.Strategy) -> int:
    """This worker's index among `num_workers(strategy)`: a `chief` task is 0, `worker` tasks follow.

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        int, from 0 to `num_workers(strategy) - 1`.

    Example:

    ```python
    keras_scaling.devices.worker_index(tf.distribute.get_strategy())   # 0
    ```
    """
    resolver = strategy.cluster_resolver if _is_multi_worker(strategy) else None
    if resolver is None or resolver.task_type == "chief":
        return 0
    return resolver.task_id + bool(resolver.cluster_spec().as_dict().get("chief"))


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this worker writes logs, files and checkpoints: the chief, or worker 0 without one.

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        bool.

    Example:

    ```python
    keras_scaling.devices.is_chief(tf.distribute.get_strategy())   # True
    ```
    """
    return not _is_multi_worker(strategy) or bool(strategy.extended.should_checkpoint)


def num_replicas(strategy: tf.distribute.Strategy) -> int:
    """All replicas of the strategy, in sync across every worker.

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        int, `strategy.num_replicas_in_sync`.

    Example:

    ```python
    keras_scaling.devices.num_replicas(tf.distribute.get_strategy())   # 1
    ```
    """
    return int(strategy.num_replicas_in_sync)


def replicas_per_worker(strategy: tf.distribute.Strategy) -> int:
    """The replicas of one worker: `num_replicas(strategy) // num_workers(strategy)`.

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        int, at least 1.

    Example:

    ```python
    keras_scaling.devices.replicas_per_worker(tf.distribute.get_strategy())   # 1
    ```
    """
    return num_replicas(strategy) // num_workers(strategy)


def local_copy(variable: Any, strategy: tf.distribute.Strategy) -> Any:
    """This worker's first copy of a Keras variable, `tf.Variable` or per-replica value."""
    # A Keras variable's `value` is a property giving its tf.Variable; a
    # tf.Variable's `value` is a method, and distributed values have none.
    if isinstance(getattr(type(variable), "value", None), property):
        variable = variable.value
    return strategy.experimental_local_results(variable)[0]


def read_int(variable: Any) -> int:
    """The value of a local integer `tf.Variable`, read eagerly between steps."""
    # One ReadVariableOp costs about 20 microseconds, numpy() about 100.
    handle = getattr(variable, "handle", None)
    if isinstance(handle, tf.Tensor) and handle.dtype == tf.resource:
        try:
            return int(tf.raw_ops.ReadVariableOp(resource=handle, dtype=variable.dtype))
        except (TypeError, ValueError, AttributeError):
            pass  # not a plain resource variable: read it the usual way
    return int(variable.numpy())


def replica_device_names(strategy: tf.distribute.Strategy) -> list[str]:
    """A device name for every replica, in the order of `all_gather`.

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        list of str, `num_replicas(strategy)` names: other workers' are this worker's devices
        under their task index, or `"worker W replica R"` when the names carry no task.

    Example:

    ```python
    keras_scaling.devices.replica_device_names(tf.distribute.get_strategy())
    # ['/job:localhost/replica:0/task:0/device:CPU:0']
    ```
    """
    local, this_worker = _local_devices(strategy), worker_index(strategy)
    names = []
    for worker in range(num_workers(strategy)):
        for position, name in enumerate(local):
            if worker == this_worker:
                names.append(name)
            elif "/task:" in name:
                names.append(re.sub(r"/task:\d+", f"/task:{worker}", name, count=1))
            else:
                names.append(f"worker {worker} replica {position}")
    return names
