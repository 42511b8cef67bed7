"""Workers, replicas and devices of a strategy: the one place that counts them.

Plain functions of a `tf.distribute.Strategy`, importing nothing else of
keras_scaling, so every module (including `compat`) can use them without an
import cycle. `keras_scaling.devices` gives the public ones, beside the
strategies of `keras_scaling.devices.strategies`.
"""

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import tensorflow as tf

if TYPE_CHECKING:
    pass


def _local_devices(strategy: tf.distribute.Strategy) -> tuple[str, ...]:
    try:
        return tuple(strategy.extended.worker_devices)
    except RuntimeError:
        # The default strategy has no device list: it runs where TensorFlow
        # places ops, the first GPU if there is one.
        gpus = tf.config.list_logical_devices("GPU")
        cpus = tf.config.list_logical_devices("CPU")
        return ((gpus or cpus)[0].name,)


def _device_kind(device_names: Iterable[str]) -> str:
    for kind in ("TPU", "GPU"):
        if any(f"{kind}:" in name.upper() for name in device_names):
            return kind
    return "CPU"


def _is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """The number of workers (machines or processes) the strategy spans.

    1 for every strategy but `MultiWorkerMirroredStrategy` (the workers of
    its cluster) and `TPUStrategy` (the TPU hosts).

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        int, at least 1.

    Example:

    ```python
    import tensorflow as tf
    from keras_scaling import devices
    devices.num_workers(tf.distribute.get_strategy())   # 1
    ```
    """
    if _is_multi_worker(strategy):
        cluster = strategy.cluster_resolver.cluster_spec().as_dict()
        return max(1, sum(len(cluster.get(job, ())) for job in ("chief", "worker")))
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return strategy.extended.num_hosts
    return 1


def worker_index(strategy: tf.distribute.Strategy) -> int:
    """This worker's index among `num_workers(strategy)`: 0 on a single worker.

    With a `chief` task in `TF_CONFIG` the chief is worker 0 and the
    `worker` tasks follow it.

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        int, from 0 to `num_workers(strategy) - 1`.

    Example:

    ```python
    import tensorflow as tf
    from keras_scaling import devices
    devices.worker_index(tf.distribute.get_strategy())   # 0
    ```
    """
    if not _is_multi_worker(strategy):
        return 0
    resolver = strategy.cluster_resolver
    has_chief = bool(resolver.cluster_spec().as_dict().get("chief"))
    if resolver.task_type == "chief":
        return 0
    return resolver.task_id + (1 if has_chief else 0)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this worker is the one that writes logs, files and checkpoints.

    Always true on a single worker; under `MultiWorkerMirroredStrategy`, true
    on the chief only (worker 0 when `TF_CONFIG` has no `chief` task).

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        bool.

    Example:

    ```python
    import tensorflow as tf
    from keras_scaling import devices
    if devices.is_chief(tf.distribute.get_strategy()):
        print("this worker writes the logs")
    ```
    """
    if not _is_multi_worker(strategy):
        return True
    return bool(strategy.extended.should_checkpoint)


def num_replicas(strategy: tf.distribute.Strategy) -> int:
    """All replicas of the strategy, in sync across every worker.

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        int, `strategy.num_replicas_in_sync`.

    Example:

    ```python
    import tensorflow as tf
    from keras_scaling import devices
    devices.num_replicas(tf.distribute.get_strategy())   # 1
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
    import tensorflow as tf
    from keras_scaling import devices
    devices.replicas_per_worker(tf.distribute.get_strategy())   # 1
    ```
    """
    return num_replicas(strategy) // num_workers(strategy)


def local_copy(variable: Any, strategy: tf.distribute.Strategy) -> Any:
    """This worker's first copy of a (possibly mirrored) variable or per-replica value.

    All copies of a mirrored variable are equal; reading one costs a fraction
    of reading the variable as a whole. A Keras variable is read through the
    `tf.Variable` it wraps (its public `value`).

    Args:
        variable: a Keras variable, a `tf.Variable` (such as
            `model.optimizer.iterations`) or `tf.distribute` values.
        strategy: the `tf.distribute.Strategy` it was created under.

    Returns:
        A `tf.Variable` or tensor: call `.numpy()` to read it eagerly.
    """
    # A Keras variable's `value` is a property giving its tf.Variable; a
    # tf.Variable's `value` is a method, and distributed values have none.
    if isinstance(getattr(type(variable), "value", None), property):
        variable = variable.value
    return strategy.experimental_local_results(variable)[0]


def read_int(variable: Any) -> int:
    """The value of a local integer `tf.Variable` (one copy), read eagerly.

    Reading waits for the work queued before it on the variable's device.
    One `ReadVariableOp` costs about 20 microseconds, where `numpy()` (a
    name scope, an identity op and the dispatch layers around the same op)
    costs about 100: this runs between training steps.

    Args:
        variable: a `tf.Variable` on one device, such as `local_copy`'s.

    Returns:
        int.
    """
    handle = getattr(variable, "handle", None)
    if isinstance(handle, tf.Tensor) and handle.dtype == tf.resource:
        try:
            return int(tf.raw_ops.ReadVariableOp(resource=handle, dtype=variable.dtype))
        except (TypeError, ValueError, AttributeError):
            pass  # not a plain resource variable: read it the usual way
    return int(variable.numpy())


def work_done_on_return(device_kind: str) -> bool:
    """Whether a call of a `tf.function` on `device_kind` devices returns only once their work is done.

    CPU kernels run within the call under eager's synchronous execution (the
    default), so a read right after it waits for nothing; a GPU or TPU call
    returns once its work is queued, and the next read waits for that work.

    Args:
        device_kind: `"CPU"`, `"GPU"` or `"TPU"`, as in `describe_strategy`.

    Returns:
        bool.
    """
    return device_kind == "CPU" and tf.config.experimental.get_synchronous_execution()


def replica_device_names(strategy: tf.distribute.Strategy) -> list[str]:
    """A device name for every replica, in the order of `all_gather`.

    This worker's replicas are named by their devices; another worker's
    replicas by the same local devices under that worker's task index, or
    `"worker W replica R"` when the local names carry no task.

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        list of str, `num_replicas(strategy)` names.

    Example:

    ```python
    import tensorflow as tf
    from keras_scaling import devices
    devices.replica_device_names(tf.distribute.get_strategy())
    # ['/job:localhost/replica:0/task:0/device:CPU:0']
    ```
    """
    local = list(_local_devices(strategy))
    this_worker = worker_index(strategy)
    names = []
    for worker in range(num_workers(strategy)):
        for position, name in enumerate(local):
            if worker == this_worker:
                names.append(name)
            elif "/task:" in name:
                before, _, after = name.partition("/task:")
                rest = after.split("/", 1)
                suffix = "/" + rest[1] if len(rest) > 1 else ""
                names.append(f"{before}/task:{worker}{suffix}")
            else:
                names.append(f"worker {worker} replica {position}")
    return names
