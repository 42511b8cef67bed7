"""Making and describing strategies: the logical CPUs, the strategy that fits the devices, its description.

A strategy's workers, replicas and devices are counted in
`keras_scaling.devices._topology`, which this module re-exports; both are
`keras_scaling.devices`.
"""

import dataclasses
import glob
import json
import logging
import os
import weakref
from typing import Any, TypeGuard

import tensorflow as tf

from keras_scaling import _validation, cluster, compat
from keras_scaling.cluster import _tensorflow as _cluster_tf
from keras_scaling.devices._topology import (
    _device_kind,
    _is_multi_worker,
    _local_devices,
    is_chief,
    num_replicas,
    num_workers,
    replica_device_names,
    replicas_per_worker,
    worker_index,
)
from keras_scaling.internals import _probes
from keras_scaling.launch._environment import CPU_DEVICES_ENV as _CPU_DEVICES_ENV

__all__ = [
    "StrategyInfo",
    "auto_strategy",
    "describe_strategy",
    "is_chief",
    "num_replicas",
    "num_workers",
    "replica_device_names",
    "replicas_per_worker",
    "strategy_kind",
    "tf_config",
    "use_logical_cpus",
    "warn_if_keras_distribution_set",
    "worker_index",
]

logger = logging.getLogger("keras_scaling")


def use_logical_cpus(n: int) -> list[str]:
    """Split the host CPU into `n` logical devices.

    A real `tf.distribute.MirroredStrategy` with `n` replicas then runs on a
    machine without accelerators, such as a laptop or a CI runner. The logical
    devices share the host's cores, so they show that training is correct on
    several replicas; they only show real parallel speedup while `n` is at most
    the number of cores.

    TensorFlow fixes its devices the first time it uses them, so this must be
    called once per process, before anything touches a device (building a
    model, creating a tensor or a strategy). Calling it again with the same
    `n` is harmless; with a different `n` it raises.

    Args:
        n: int, the number of logical CPU devices, at least 1.

    Returns:
        The list of logical CPU device names, such as `["/device:CPU:0", ...]`.

    Raises:
        TypeError: `n` is not an integer.
        ValueError: `n` is smaller than 1.
        RuntimeError: TensorFlow has already initialised its devices with a
            different number of CPUs.

    Example:

    ```python
    import keras_scaling
    keras_scaling.use_logical_cpus(4)
    strategy = keras_scaling.auto_strategy()   # MirroredStrategy, 4 replicas
    ```
    """
    n = _validation.positive_int(n, "n", fix="Pass the number of logical CPUs, such as 2.")
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
    except RuntimeError as error:
        current = tf.config.list_logical_devices("CPU")
        if len(current) == n:
            return [device.name for device in current]
        raise RuntimeError(
            f"use_logical_cpus({n}) was called after TensorFlow initialised its "
            f"devices ({len(current)} logical CPU(s) now). Call it once, at the "
            "start of the process, before building models, tensors or "
            "strategies."
        ) from error
    return [device.name for device in tf.config.list_logical_devices("CPU")]


def _apply_cpu_devices_from_env(spec: "cluster.ClusterSpec | None" = None) -> None:
    """Honours `KERAS_SCALING_CPU_DEVICES`, set by `keras-scaling launch`."""
    value = os.environ.get(_CPU_DEVICES_ENV)
    if not value:
        return
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{_CPU_DEVICES_ENV} must be a positive integer, got {value!r}")
    if _tf_config_worker_count() > 1 or _trains_with_others(spec):
        # MultiWorkerMirroredStrategy configures collective ops, which must
        # happen before TensorFlow initialises its context; listing the logical
        # devices, as use_logical_cpus does to return them, initialises it.
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
        return
    use_logical_cpus(count)


def tf_config() -> dict[str, Any]:
    """Returns the parsed `TF_CONFIG` environment variable, or `{}`.

    `TF_CONFIG` describes a multi-worker cluster and this process's task in
    it; `keras-scaling launch` sets it for every worker it starts. An unset
    or empty variable gives `{}`.

    Returns:
        dict, the decoded JSON object, such as `{"cluster": {"worker": [...]},
        "task": {"type": "worker", "index": 0}}`, or `{}`.

    Raises:
        ValueError: `TF_CONFIG` is not valid JSON, or not a JSON object.

    Example:

    ```python
    from keras_scaling import devices
    config = devices.tf_config()
    workers = config.get("cluster", {}).get("worker", [])
    print(f"{len(workers)} worker(s) in TF_CONFIG")
    ```
    """
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object, got {raw!r}")
    return config


def _tf_config_worker_count() -> int:
    jobs = tf_config().get("cluster", {})
    return len(jobs.get("worker", [])) + len(jobs.get("chief", []))


def _trains_with_others(spec: "cluster.ClusterSpec | None") -> "TypeGuard[cluster.ClusterSpec]":
    return spec is not None and spec.task_type != "evaluator" and spec.num_workers > 1


def _tpu_address() -> str | None:
    """The TPU to resolve, or None: looks only at local signs, never the network."""
    if os.environ.get("TPU_NAME"):
        return os.environ["TPU_NAME"]
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return "local"
    return None


def auto_strategy(
    cross_device_ops: str | None = None,
    communication: str | None = None,
    bytes_per_pack: int | None = None,
) -> tf.distribute.Strategy:
    """Pick the `tf.distribute` strategy that fits this machine, and say why.

    In order of preference:

    1. `TPUStrategy` when a TPU is attached (a TPU VM, or `TPU_NAME` set).
    2. `MultiWorkerMirroredStrategy` when this process is one of several
       workers: `TF_CONFIG` names more than one (as `keras-scaling launch`,
       Vertex AI and Kubeflow write it, `chief` task included), or
       `KERAS_SCALING_WORKER_HOSTS` with `JOB_COMPLETION_INDEX` (a Kubernetes
       Indexed Job), or this is a task of a Slurm job step of several tasks
       (`srun`), with no `TF_CONFIG` needed. `TF_CONFIG` wins over the others.
       An `evaluator` task of `TF_CONFIG` (listed in its cluster, as Vertex
       AI writes it, or left out, as Kubeflow's TFJob does) evaluates alone:
       it gets the strategy this machine's devices give. `ps` tasks in
       `TF_CONFIG` are an error: they need `ParameterServerStrategy`.
    3. `MirroredStrategy` over all GPUs when there are two or more.
    4. `MirroredStrategy` over the logical CPUs when `use_logical_cpus` (or
       `KERAS_SCALING_CPU_DEVICES`) made several.
    5. Otherwise the default strategy (one device).

    The choice and its reason, with where the cluster came from
    (`keras_scaling.cluster.describe_cluster()`, also in
    `describe_strategy()`), are logged at INFO level on the
    `keras_scaling` logger. With more than one replica, `keras_scaling.compat`
    is enabled (unless `KERAS_SCALING_NO_COMPAT=1`), so `model.fit` works
    under the chosen strategy.

    Args:
        cross_device_ops: the all-reduce of a `MirroredStrategy` on one
            machine: `"reduction_to_one_device"`, `"hierarchical_copy"` or
            `"nccl"` (GPUs only), as `keras_scaling.tune` measures them;
            None (default) leaves TensorFlow's choice. Other strategies
            ignore it.
        communication: the all-reduce across workers of a
            `MultiWorkerMirroredStrategy`: `"auto"`, `"ring"` or `"nccl"`
            (`tf.distribute.experimental.CommunicationImplementation`);
            None (default) leaves TensorFlow's choice. Other strategies
            ignore it.
        bytes_per_pack: int >= 0, the size of the packs gradients are
            grouped into across workers (0 or None: TensorFlow's choice).
            Other strategies ignore it.

    Returns:
        A `tf.distribute.Strategy`.

    Raises:
        keras_scaling.cluster.NotInStepError: a Slurm job of several tasks
            runs this Python outside `srun`, so the other tasks never start.
        ValueError: an unknown `cross_device_ops` or `communication`, a
            negative `bytes_per_pack`, the cluster's environment is malformed, `TF_CONFIG` has
            `ps` tasks, a Slurm node name does not resolve, or this task's
            port is in use.

    Example:

    ```python
    import keras, keras_scaling
    strategy = keras_scaling.auto_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    ```
    """
    warn_if_keras_distribution_set()
    options = _communication_options(communication, bytes_per_pack)
    spec = cluster.resolve_cluster()
    if _trains_with_others(spec) and spec.source in ("slurm", "kubernetes"):
        _cluster_tf.check_addresses(spec)
    if _trains_with_others(spec) and spec.source == "slurm":
        _cluster_tf.bind_task_gpus(spec)
    _apply_cpu_devices_from_env(spec)
    strategy, reason = _choose_strategy(spec, _cross_device_ops(cross_device_ops), options)
    if spec is not None:
        _cluster_origins[strategy] = spec.origin
        reason = f"{reason}; cluster from {spec.origin}"
    logger.info("auto_strategy: %s (%s)", strategy_kind(strategy), reason)
    if num_replicas(strategy) > 1:
        compat.enable_for(strategy)
    return strategy


_keras_distribution_warned = False


def warn_if_keras_distribution_set() -> bool:
    """Warns once when a `keras.distribution` distribution is set.

    On the TensorFlow backend, `keras.distribution.set_distribution(...)`
    (such as `DataParallel`) trains silently on one device: that API is
    built for JAX. Data parallelism on TensorFlow is a `tf.distribute`
    strategy, such as `keras_scaling.auto_strategy()`.

    Returns:
        bool, whether a distribution is set.

    Example:

    ```python
    from keras_scaling import devices
    devices.warn_if_keras_distribution_set()   # False: none is set
    ```
    """
    global _keras_distribution_warned
    import keras

    distribution = keras.distribution.distribution()
    if distribution is None:
        return False
    if not _keras_distribution_warned and keras.backend.backend() == "tensorflow":
        _keras_distribution_warned = True
        logger.warning(
            "keras_scaling: keras.distribution.set_distribution(%s) is set, but on "
            "the TensorFlow backend the keras.distribution API does not spread "
            "training over devices (it is built for JAX): the model trains on one "
            "device. Use a tf.distribute strategy instead: build and compile the "
            "model under keras_scaling.auto_strategy().scope(), and call "
            "keras.distribution.set_distribution(None).",
            type(distribution).__name__,
        )
    return True


# The origin of the cluster of each strategy auto_strategy built, for
# describe_strategy; weak, so a strategy is not kept alive by being described.
_cluster_origins: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cross_device_ops(name: str | None) -> Any:
    """The `tf.distribute` cross-device ops named `name`, or None for TensorFlow's choice."""
    choices = {
        "reduction_to_one_device": tf.distribute.ReductionToOneDevice,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
        "nccl": tf.distribute.NcclAllReduce,
    }
    if name is None:
        return None
    if name not in choices:
        raise ValueError(
            f"cross_device_ops must be one of {', '.join(sorted(choices))} or None, got {name!r}"
        )
    return choices[name]()


def _communication_options(communication: str | None, bytes_per_pack: int | None) -> Any:
    """`tf.distribute.experimental.CommunicationOptions` of the names given, or None for TensorFlow's."""
    implementations = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }
    if communication is not None and communication not in implementations:
        raise ValueError(
            f"communication must be one of {', '.join(implementations)} or None, "
            f"got {communication!r}"
        )
    if bytes_per_pack is not None and (
        isinstance(bytes_per_pack, bool)
        or not isinstance(bytes_per_pack, int)
        or bytes_per_pack < 0
    ):
        raise ValueError(
            f"bytes_per_pack must be an integer >= 0 (0: TensorFlow's choice), got {bytes_per_pack!r}"
        )
    if communication is None and not bytes_per_pack:
        return None
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack or 0,
        implementation=implementations[communication or "auto"],
    )


def _choose_strategy(
    spec: "cluster.ClusterSpec | None" = None,
    cross_device_ops: Any = None,
    communication_options: Any = None,
) -> tuple[tf.distribute.Strategy, str]:
    tpu = _tpu_address()
    if tpu is not None:
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            return tf.distribute.TPUStrategy(resolver), f"TPU {tpu!r} found"
        except (ValueError, RuntimeError, tf.errors.OpError) as error:
            if tpu != "local":
                raise
            # Device files such as /dev/vfio/N also exist on hosts that pass
            # other hardware through to virtual machines.
            logger.warning(
                "auto_strategy: accelerator device files suggest a TPU, but none "
                "could be initialised (%s); looking for other devices",
                error,
            )
    if _trains_with_others(spec):
        if spec.source in ("tf_config", "launch"):
            return _multi_worker_strategy(
                communication_options=communication_options
            ), f"{spec.num_workers} workers"
        return _multi_worker_strategy(
            _cluster_tf.cluster_resolver(spec), communication_options
        ), f"{spec.num_workers} workers"
    if spec is not None and spec.task_type == "evaluator":
        logger.info(
            "auto_strategy: TF_CONFIG makes this task the evaluator, which evaluates "
            "alone and trains with nobody: it gets a strategy over this machine's "
            "devices, to evaluate the checkpoints the chief writes"
        )
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) >= 2:
        return tf.distribute.MirroredStrategy(
            cross_device_ops=cross_device_ops
        ), f"{len(gpus)} GPUs found"
    cpus = tf.config.list_logical_devices("CPU")
    if len(gpus) == 0 and len(cpus) >= 2:
        return (
            tf.distribute.MirroredStrategy(
                [device.name for device in cpus], cross_device_ops=cross_device_ops
            ),
            f"{len(cpus)} logical CPUs and no GPU",
        )
    return tf.distribute.get_strategy(), "one device: no TPU, workers or several devices"


def _multi_worker_strategy(
    cluster_resolver: Any = None, communication_options: Any = None
) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy with one replica per logical CPU when there is no GPU."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    cpu_count = len(tf.config.get_logical_device_configuration(cpu) or [None])
    hook = None
    if cpu_count > 1 and not tf.config.list_physical_devices("GPU"):
        hook = _collective_local_devices_hook()
    if hook is None:
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=cluster_resolver, communication_options=communication_options
        )
    extended, original = hook

    # TensorFlow gives a worker without accelerators a single CPU replica,
    # whatever its logical CPUs; here the replicas follow the logical CPUs, as
    # MirroredStrategy's do on one machine.
    def _initialize_local_devices(
        self: Any, cluster_resolver: Any, worker_device: str
    ) -> tuple[tuple[str, ...], str]:
        devices, kind = original(self, cluster_resolver, worker_device)
        if kind == "CPU":
            devices = tuple(f"{worker_device}/device:CPU:{i}" for i in range(cpu_count))
        return devices, kind

    extended._initialize_local_devices = _initialize_local_devices
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=cluster_resolver, communication_options=communication_options
        )
    finally:
        extended._initialize_local_devices = original


@_probes.guarded(
    "tf.collective_local_devices",
    reaches="tensorflow.python.distribute.collective_all_reduce_strategy."
    "CollectiveAllReduceExtended._initialize_local_devices",
    lost="each worker without a GPU runs one replica, not one per logical CPU",
    workaround="Run one logical CPU per worker (launch --cpu-devices 1), or use GPUs.",
)
def _collective_local_devices_hook() -> tuple[Any, Any]:
    """(the class that picks a worker's devices, its original method), or None."""
    from tensorflow.python.distribute import collective_all_reduce_strategy as collective

    extended = collective.CollectiveAllReduceExtended
    original = extended.__dict__["_initialize_local_devices"]
    if not callable(original):
        raise TypeError("_initialize_local_devices is not a method")
    return extended, original


@dataclasses.dataclass(frozen=True)
class StrategyInfo:
    """What a strategy runs on: kind, workers, replicas and devices.

    Args:
        kind: the strategy's class name, such as `"MirroredStrategy"`.
        num_workers: the number of worker machines or processes.
        worker_index: this worker's index, 0 for the chief.
        is_chief: whether this worker writes logs and checkpoints.
        num_replicas: replicas in sync across all workers.
        local_devices: the device names of this worker's replicas.
        device_kind: `"CPU"`, `"GPU"` or `"TPU"`.
        cluster_origin: where the workers' cluster came from, such as
            `"Slurm job 1234 step 0: 4 tasks on 2 nodes"` or `"TF_CONFIG: 2
            workers; ..."` (`keras_scaling.cluster.describe_cluster()`), or
            `""` on a single worker.

    Example:

    ```python
    import tensorflow as tf, keras_scaling
    keras_scaling.use_logical_cpus(2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    info = keras_scaling.describe_strategy(strategy)
    print(info)          # MirroredStrategy: 1 worker, 2 replicas on CPU ...
    info.num_replicas    # 2
    ```
    """

    kind: str
    num_workers: int
    worker_index: int
    is_chief: bool
    num_replicas: int
    local_devices: tuple[str, ...]
    device_kind: str
    cluster_origin: str = ""

    @property
    def replicas_per_worker(self) -> int:
        """Replicas on each worker."""
        return self.num_replicas // self.num_workers

    def __str__(self) -> str:
        workers = "worker" if self.num_workers == 1 else "workers"
        replicas = "replica" if self.num_replicas == 1 else "replicas"
        text = (
            f"{self.kind}: {self.num_workers} {workers}, {self.num_replicas} "
            f"{replicas} on {self.device_kind} ({', '.join(self.local_devices)})"
        )
        if self.num_workers > 1:
            text += f"; this is worker {self.worker_index}"
            text += " (chief)" if self.is_chief else ""
        if self.cluster_origin:
            text += f"; cluster from {self.cluster_origin}"
        return text


def describe_strategy(strategy: tf.distribute.Strategy | None = None) -> StrategyInfo:
    """Describe a strategy: kind, workers, replicas and device names.

    Args:
        strategy: a `tf.distribute.Strategy`; defaults to the current one
            (`tf.distribute.get_strategy()`).

    Returns:
        A `StrategyInfo`, whose `str` is one readable line.

    Example:

    ```python
    keras_scaling.use_logical_cpus(2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    print(keras_scaling.describe_strategy(strategy))
    # MirroredStrategy: 1 worker, 2 replicas on CPU (/job:localhost/.../CPU:0, ...)
    ```
    """
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"strategy must be a tf.distribute.Strategy, got {type(strategy).__name__}")
    devices = _local_devices(strategy)
    return StrategyInfo(
        kind=strategy_kind(strategy),
        num_workers=num_workers(strategy),
        worker_index=worker_index(strategy),
        is_chief=is_chief(strategy),
        num_replicas=num_replicas(strategy),
        local_devices=devices,
        device_kind=_device_kind(devices),
        cluster_origin=_cluster_origin(strategy),
    )


def _cluster_origin(strategy: tf.distribute.Strategy) -> str:
    origin = _cluster_origins.get(strategy)
    if origin is not None:
        return origin
    if not _is_multi_worker(strategy):
        return ""
    resolver = strategy.cluster_resolver
    if isinstance(resolver, tf.distribute.cluster_resolver.TFConfigClusterResolver):
        try:
            spec = cluster.tf_config_cluster(os.environ)
        except ValueError:
            # A strategy built by hand over a TF_CONFIG auto_strategy refuses.
            return "TF_CONFIG"
        return spec.origin if spec is not None else "TF_CONFIG"
    return f"a {type(resolver).__name__}"


def strategy_kind(strategy: tf.distribute.Strategy) -> str:
    """The strategy's public class name.

    `tf.distribute.MultiWorkerMirroredStrategy()` is an instance of the
    internal `CollectiveAllReduceStrategy`; users know it by its public name.

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        str, such as `"MirroredStrategy"` or `"MultiWorkerMirroredStrategy"`.

    Example:

    ```python
    import tensorflow as tf
    from keras_scaling import devices
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    devices.strategy_kind(strategy)   # 'MirroredStrategy'
    ```
    """
    if _is_multi_worker(strategy):
        return "MultiWorkerMirroredStrategy"
    return type(strategy).__name__
