"""Making and describing strategies; re-exports the counts of `keras_scaling.devices._topology`."""

import dataclasses
import glob
import logging
import os
from typing import Any, TypeGuard

import tensorflow as tf

from keras_scaling import _validation, cluster, compat, devices
from keras_scaling.cluster import _tensorflow as _cluster_tf
from keras_scaling.devices._topology import (
    _device_kind,
    _is_multi_worker,
    _local_devices,
    is_chief,
    num_replicas,
    num_workers,
    replica_device_names,  # noqa: F401  (in __all__)
    replicas_per_worker,  # noqa: F401  (in __all__)
    worker_index,
)
from keras_scaling.internals import _probes
from keras_scaling.launch._environment import CPU_DEVICES_ENV as _CPU_DEVICES_ENV

__all__ = list(devices.__all__)

logger = logging.getLogger("keras_scaling")
_ORIGIN_ATTRIBUTE = "_keras_scaling_cluster_origin"


def use_logical_cpus(
    n: int, *, threads_per_device: int | None = None, inter_op_threads: int | None = None
) -> list[str]:
    """Split the host CPU into `n` logical devices, for a real `MirroredStrategy` of `n` replicas.

    The devices share the host's cores. Call it before anything touches a
    device (a model, a tensor, a strategy); again with the same `n` is harmless.

    Args:
        n: int, the number of logical CPU devices, at least 1.
        threads_per_device: int, an intra-op thread pool of this many threads
            for each logical CPU; None (default) keeps TensorFlow's shared pool.
        inter_op_threads: int, threads running independent ops side by side;
            None (default) lets TensorFlow choose.

    Returns:
        The logical CPU device names, such as `["/device:CPU:0", ...]`.

    Raises:
        TypeError: `n` is not an integer.
        ValueError: `n` is smaller than 1.
        RuntimeError: TensorFlow's devices are already set up with another count.

    Example:

    ```python
    keras_scaling.use_logical_cpus(4)
    strategy = keras_scaling.auto_strategy()   # MirroredStrategy, 4 replicas
    ```
    """
    n = _validation.positive_int(n, "n", fix="Pass the number of logical CPUs, such as 2.")
    threads_per_device = _validation.optional_positive_int(threads_per_device, "threads_per_device")
    inter_op_threads = _validation.optional_positive_int(inter_op_threads, "inter_op_threads")
    try:
        if threads_per_device is not None:
            # Read when the devices are made (tensorflow/core/common_runtime/local_device.cc).
            os.environ["TF_OVERRIDE_GLOBAL_THREADPOOL"] = "1"
            tf.config.threading.set_intra_op_parallelism_threads(threads_per_device)
        if inter_op_threads is not None:
            tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
        try:
            _split_cpu(n)
        except RuntimeError:
            if len(tf.config.list_logical_devices("CPU")) != n:
                raise
    except RuntimeError as error:
        current = len(tf.config.list_logical_devices("CPU"))
        raise RuntimeError(
            f"use_logical_cpus({n}) was called after TensorFlow initialised its devices ({current} logical CPU(s) now): call it first in the process, before building models, tensors or strategies."
        ) from error
    return [device.name for device in tf.config.list_logical_devices("CPU")]


def _split_cpu(count: int) -> None:
    """Makes `count` logical CPUs of the host's; RuntimeError once TensorFlow made its devices."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * count
    )


def _apply_cpu_devices_from_env(spec: "cluster.ClusterSpec | None" = None) -> None:
    """Honours `KERAS_SCALING_CPU_DEVICES`, which `keras-scaling launch` sets."""
    value = os.environ.get(_CPU_DEVICES_ENV)
    if not value:
        return
    count = int(value) if value.strip().isdigit() else 0
    if count < 1:
        raise ValueError(f"{_CPU_DEVICES_ENV} must be a positive integer, got {value!r}")
    if _tf_config_worker_count() > 1 or _trains_with_others(spec):
        # MultiWorkerMirroredStrategy configures collective ops before TensorFlow
        # initialises its context, which listing the devices (use_logical_cpus) does.
        _split_cpu(count)
    else:
        use_logical_cpus(count)


def tf_config() -> dict[str, Any]:
    """The parsed `TF_CONFIG` environment variable (a cluster and this task in it), or `{}`.

    Returns:
        dict, such as `{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": 0}}`.

    Raises:
        ValueError: `TF_CONFIG` is not valid JSON, or not a JSON object.

    Example:

    ```python
    workers = keras_scaling.devices.tf_config().get("cluster", {}).get("worker", [])
    ```
    """
    return cluster._parse_tf_config(os.environ.get("TF_CONFIG") or "{}")


def _tf_config_worker_count() -> int:
    jobs = tf_config().get("cluster", {})
    return len(jobs.get("worker", [])) + len(jobs.get("chief", []))


def _trains_with_others(spec: "cluster.ClusterSpec | None") -> "TypeGuard[cluster.ClusterSpec]":
    return spec is not None and spec.task_type != "evaluator" and spec.num_workers > 1


def _tpu_address() -> str | None:
    """The TPU to resolve, or None: looks only at local signs, never the network."""
    local = glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
    return os.environ.get("TPU_NAME") or ("local" if local else None)


def auto_strategy(
    cross_device_ops: str | None = None,
    communication: str | None = None,
    bytes_per_pack: int | None = None,
) -> tf.distribute.Strategy:
    """Pick the `tf.distribute` strategy that fits this machine, and log why.

    `TPUStrategy`, `MultiWorkerMirroredStrategy` (`TF_CONFIG`, a Slurm step, a Kubernetes
    Indexed Job), `MirroredStrategy` over GPUs or logical CPUs, or the default strategy, as
    the strategies guide says; with several replicas, `keras_scaling.compat` is enabled.

    Args:
        cross_device_ops: a `MirroredStrategy`'s all-reduce on one machine:
            `"reduction_to_one_device"`, `"hierarchical_copy"` or `"nccl"`.
        communication: the all-reduce across workers: `"auto"`, `"ring"` or `"nccl"`.
        bytes_per_pack: int >= 0, the size of the packs gradients are grouped
            into across workers. None (default, or 0 here) leaves TensorFlow's
            choice, and each option is ignored where it does not apply.

    Returns:
        A `tf.distribute.Strategy`.

    Raises:
        keras_scaling.cluster.NotInStepError: a Slurm job of several tasks runs
            this Python outside `srun`.
        ValueError: an unknown option, a malformed cluster environment (`ps`
            tasks, a Slurm node that does not resolve), or this task's port in use.

    Example:

    ```python
    strategy = keras_scaling.auto_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    ```
    """
    warn_if_keras_distribution_set()
    options = _communication_options(communication, bytes_per_pack)
    spec = cluster.resolve_cluster()
    if _trains_with_others(spec) and spec.source in ("slurm", "kubernetes"):
        _cluster_tf.check_addresses(spec)
        if spec.source == "slurm":
            _cluster_tf.bind_task_gpus(spec)
    _apply_cpu_devices_from_env(spec)
    strategy, reason = _choose_strategy(spec, _cross_device_ops(cross_device_ops), options)
    if spec is not None:
        setattr(strategy, _ORIGIN_ATTRIBUTE, spec.origin)
        reason = f"{reason}; cluster from {spec.origin}"
    logger.info("auto_strategy: %s (%s)", strategy_kind(strategy), reason)
    if num_replicas(strategy) > 1:
        compat.enable_for(strategy)
    return strategy


_keras_distribution_warned = False


def warn_if_keras_distribution_set() -> bool:
    """Warns once when a `keras.distribution` distribution is set: on TensorFlow it trains on one device.

    Returns:
        bool, whether a distribution is set.

    Example:

    ```python
    keras_scaling.devices.warn_if_keras_distribution_set()   # False: none is set
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
            "keras_scaling: keras.distribution.set_distribution(%s) trains on one device on the TensorFlow backend (the API is built for JAX): build and compile the model under keras_scaling.auto_strategy().scope() and call keras.distribution.set_distribution(None).",
            type(distribution).__name__,
        )
    return True


def _cross_device_ops(name: str | None) -> Any:
    choices = {"reduction_to_one_device": tf.distribute.ReductionToOneDevice}
    choices["hierarchical_copy"] = tf.distribute.HierarchicalCopyAllReduce
    choices["nccl"] = tf.distribute.NcclAllReduce
    if name is not None and name not in choices:
        raise ValueError(
            f"cross_device_ops must be one of {', '.join(sorted(choices))} or None, got {name!r}"
        )
    return None if name is None else choices[name]()


def _communication_options(communication: str | None, bytes_per_pack: int | None) -> Any:
    """`CommunicationOptions` of the names given, or None for TensorFlow's choice."""
    implementations = ("auto", "ring", "nccl")
    if communication is not None and communication not in implementations:
        raise ValueError(
            f"communication must be one of {', '.join(implementations)} or None, got {communication!r}"
        )
    if bytes_per_pack is not None and not (type(bytes_per_pack) is int and bytes_per_pack >= 0):
        raise ValueError(
            f"bytes_per_pack must be an integer >= 0 (0: TensorFlow's choice), got {bytes_per_pack!r}"
        )
    if communication is None and not bytes_per_pack:
        return None
    experimental = tf.distribute.experimental
    kind = experimental.CommunicationImplementation[(communication or "auto").upper()]
    return experimental.CommunicationOptions(bytes_per_pack or 0, implementation=kind)


def _choose_strategy(
    spec: "cluster.ClusterSpec | None", cross_device_ops: Any, communication_options: Any
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
                "auto_strategy: accelerator device files suggest a TPU, but none could be initialised (%s); looking for other devices", error
            )  # fmt: skip
    if _trains_with_others(spec):
        # TensorFlow reads TF_CONFIG (which keras-scaling launch writes) itself.
        own = spec.source in ("tf_config", "launch")
        resolver = None if own else _cluster_tf.cluster_resolver(spec)
        strategy = _multi_worker_strategy(resolver, communication_options)
        return strategy, f"{spec.num_workers} workers"
    if spec is not None and spec.task_type == "evaluator":
        logger.info(
            "auto_strategy: TF_CONFIG makes this task the evaluator, which evaluates alone and trains with nobody: it gets a strategy over this machine's devices, to evaluate the checkpoints the chief writes"
        )
    gpus = tf.config.list_logical_devices("GPU")
    cpus = [device.name for device in tf.config.list_logical_devices("CPU")]
    if len(gpus) >= 2:
        strategy = tf.distribute.MirroredStrategy(cross_device_ops=cross_device_ops)
        return strategy, f"{len(gpus)} GPUs found"
    if not gpus and len(cpus) >= 2:
        strategy = tf.distribute.MirroredStrategy(cpus, cross_device_ops=cross_device_ops)
        return strategy, f"{len(cpus)} logical CPUs and no GPU"
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
    if hook is not None:
        extended, original = hook

        # TensorFlow gives a worker without accelerators one CPU replica, whatever
        # its logical CPUs; here they follow the logical CPUs, as on one machine.
        def _initialize_local_devices(self: Any, resolver: Any, worker_device: str) -> Any:
            devices, kind = original(self, resolver, worker_device)
            if kind == "CPU":
                devices = tuple(f"{worker_device}/device:CPU:{i}" for i in range(cpu_count))
            return devices, kind

        extended._initialize_local_devices = _initialize_local_devices
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=cluster_resolver, communication_options=communication_options
        )
    finally:
        if hook is not None:
            extended._initialize_local_devices = original


@_probes.guarded(
    "tf.collective_local_devices",
    reaches="tensorflow.python.distribute.collective_all_reduce_strategy."
    "CollectiveAllReduceExtended._initialize_local_devices",
    lost="each worker without a GPU runs one replica, not one per logical CPU",
    workaround="Run one logical CPU per worker (launch --cpu-devices 1), or use GPUs.",
)
def _collective_local_devices_hook() -> tuple[Any, Any]:
    from tensorflow.python.distribute import collective_all_reduce_strategy as collective

    extended = collective.CollectiveAllReduceExtended
    original = extended.__dict__["_initialize_local_devices"]
    if not callable(original):
        raise TypeError("_initialize_local_devices is not a method")
    return extended, original


@dataclasses.dataclass(frozen=True)
class StrategyInfo:
    """What a strategy runs on: kind, workers, replicas and devices; `str` is one line.

    Args:
        kind: the strategy's class name, such as `"MirroredStrategy"`.
        num_workers: the number of worker machines or processes.
        worker_index: this worker's index, 0 for the chief.
        is_chief: whether this worker writes logs and checkpoints.
        num_replicas: replicas in sync across all workers.
        local_devices: the device names of this worker's replicas.
        device_kind: `"CPU"`, `"GPU"` or `"TPU"`.
        cluster_origin: where the cluster came from, such as `"Slurm job 1234
            step 0: 4 tasks on 2 nodes"`, or `""` on a single worker.

    Example:

    ```python
    info = keras_scaling.describe_strategy(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    info.num_replicas, info.device_kind   # (2, 'CPU')
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
        several = self.num_workers > 1
        text = f"{self.kind}: {self.num_workers} worker{'s' * several}, {self.num_replicas} replica{'s' * (self.num_replicas > 1)} on {self.device_kind} ({', '.join(self.local_devices)})"
        text += f"; this is worker {self.worker_index}{' (chief)' * self.is_chief}" * several
        return text + f"; cluster from {self.cluster_origin}" * bool(self.cluster_origin)


def describe_strategy(strategy: tf.distribute.Strategy | None = None) -> StrategyInfo:
    """Describe a strategy: kind, workers, replicas and device names.

    Args:
        strategy: a `tf.distribute.Strategy`; defaults to the current one.

    Returns:
        A `StrategyInfo`.

    Raises:
        TypeError: `strategy` is not a `tf.distribute.Strategy`.

    Example:

    ```python
    print(keras_scaling.describe_strategy(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])))
    # MirroredStrategy: 1 worker, 2 replicas on CPU (/job:localhost/.../CPU:0, ...)
    ```
    """
    strategy = tf.distribute.get_strategy() if strategy is None else strategy
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(
            f"strategy must be a tf.distribute.Strategy or None (the current one), got {type(strategy).__name__}: create one with keras_scaling.auto_strategy()."
        )
    devices = _local_devices(strategy)
    return StrategyInfo(
        strategy_kind(strategy), num_workers(strategy), worker_index(strategy), is_chief(strategy),
        num_replicas(strategy), devices, _device_kind(devices), _cluster_origin(strategy),
    )  # fmt: skip


def _cluster_origin(strategy: tf.distribute.Strategy) -> str:
    origin = getattr(strategy, _ORIGIN_ATTRIBUTE, None)
    if origin is not None or not _is_multi_worker(strategy):
        return origin or ""
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
    """The strategy's public class name (not `CollectiveAllReduceStrategy`, for instance).

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        str, such as `"MirroredStrategy"` or `"MultiWorkerMirroredStrategy"`.

    Example:

    ```python
    keras_scaling.devices.strategy_kind(tf.distribute.MirroredStrategy(["/cpu:0"]))   # 'MirroredStrategy'
    ```
    """
    if _is_multi_worker(strategy):
        return "MultiWorkerMirroredStrategy"
    return type(strategy).__name__
