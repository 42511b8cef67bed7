"""Distributed input: shard per worker, batch globally, prefetch, static shapes.

The guide `docs/guides/input.md` gives the rules of sharding, shuffling and the last batch.
"""

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_scaling import _validation, devices
from keras_scaling.data import _input_plan, _passes, _pipeline, _sources
from keras_scaling.data._input_plan import InputPlan

__all__ = ["InputPlan", "describe", "distribute", "global_batch_size", "plan_of"]

logger = logging.getLogger("keras_scaling")

# Every worker must draw the same order, so an unseeded shuffle is never used.
DEFAULT_SEED = 1234

_PLAN_ATTRIBUTE = "_keras_scaling_input_plan"
_REBUILD_ATTRIBUTE = "_keras_scaling_rebuild"

UNNUMBERED_PASSES_WARNING = "keras_scaling.data: Keras' epochs cannot number the passes here (see the warning above, or KERAS_SCALING_NO_COMPAT=1), so a batch read outside fit on one worker alone makes the workers read different samples: read the dataset only through fit, evaluate and predict, the same on every worker."


def global_batch_size(
    per_replica_batch_size: int, strategy: tf.distribute.Strategy | None = None
) -> int:
    """The global batch size for a per-replica batch size under a strategy.

    Args:
        per_replica_batch_size: int, samples per replica per step.
        strategy: a `tf.distribute.Strategy`; defaults to the current one.

    Returns:
        int, `per_replica_batch_size * strategy.num_replicas_in_sync`.

    Example:

    ```python
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    keras_scaling.data.global_batch_size(32, strategy)   # 64
    ```
    """
    num_replicas = devices.describe_strategy(strategy).num_replicas
    return _input_plan.resolve_batch_sizes(num_replicas, per_replica_batch_size)[1]


def distribute(
    data: Any,
    *,
    strategy: tf.distribute.Strategy | None = None,
    per_replica_batch_size: int | None = None,
    global_batch_size: int | None = None,
    shuffle: bool | None = None,
    seed: int | None = None,
    last_batch: str = "drop",
    shard: str = "auto",
    cache: bool | str | os.PathLike[str] = False,
    parse_fn: Callable[[Any], Any] | None = None,
    num_samples: int | None = None,
    output_signature: Any = None,
    prefetch_batches: int | None = None,
    private_threadpool_size: int | None = None,
    max_intra_op_parallelism: int | None = None,
) -> tf.data.Dataset:
    """Builds the input pipeline for data-parallel training under a strategy.

    The dataset yields global batches of this worker's share: each sample is
    read once per epoch over all workers, every worker runs the same steps
    (with several workers, `num_workers` times `dataset.cardinality()`), and
    shapes are static. Every worker must call it with the same data and
    arguments. It logs the plan and applies `keras_scaling.compat.enable_for`.

    Args:
        data: NumPy arrays as `fit` takes them; a `tf.data.Dataset`, batched
            or not; a `keras.utils.PyDataset`; a generator function, with
            `output_signature`; or a list of TFRecord paths, with `parse_fn`.
        strategy: a `tf.distribute.Strategy`; defaults to the current one.
        per_replica_batch_size: int, samples per replica per step.
        global_batch_size: int, samples per step over all replicas, a
            multiple of the replicas. Give one of the two (both if they
            agree), or neither for batched data.
        shuffle: bool; `None` (default) shuffles arrays and files, not
            datasets, as `fit` does. `False` for `evaluate` and `predict`.
        seed: int, the shuffle seed, the same on every worker; `None` is 1234.
        last_batch: `"drop"` (default), `"pad"` (zero-weight rows: `weighted_metrics`
            count each sample once) or `"partial"` (one worker, not TPU).
        shard: `"auto"` (default: by file with at least as many files as
            workers, else by element), `"file"` or `"element"`.
        cache: `False` (default), `True` (in memory) or a file path: cache
            this worker's parsed share after the first epoch; for arrays,
            their batches when not shuffled (shuffled arrays are in memory
            already, and it changes nothing).
        parse_fn: function from one element (a serialized record) to a sample.
        num_samples: int, the samples in one pass of data of unknown length.
        output_signature: a generator function's `tf.TensorSpec` structure.
        prefetch_batches: int, global batches read ahead; `None` is AUTOTUNE.
        private_threadpool_size: int, threads of the pipeline's own pool;
            `None`: TensorFlow's shared pool.
        max_intra_op_parallelism: int, threads one op may use; `None`:
            TensorFlow's choice. These three change the speed, never the batches.

    Returns:
        A `tf.data.Dataset` of global batches; `plan_of(dataset)` is its plan.

    Raises:
        TypeError: a wrong type of `strategy`, `parse_fn` or `data`.
        ValueError: bad batch sizes, `last_batch` or `shard`; data infinite,
            empty, inconsistent or contradicting `num_samples`; files without
            `parse_fn` or missing; no full step.

    Example:

    ```python
    keras_scaling.use_logical_cpus(2)
    strategy = keras_scaling.auto_strategy()
    x = np.random.rand(1000, 8).astype("float32")
    train = keras_scaling.data.distribute((x, x[:, :1]), strategy=strategy, per_replica_batch_size=32)
    keras_scaling.data.plan_of(train).global_batch_size   # 64
    next(iter(train))[0].shape   # TensorShape([64, 8])
    ```
    """
    devices.warn_if_keras_distribution_set()
    strategy = tf.distribute.get_strategy() if strategy is None else strategy
    info = devices.describe_strategy(strategy)
    from keras_scaling import compat

    compat.enable_for(strategy)
    pipeline_options = dict(
        prefetch_batches=prefetch_batches, private_threadpool_size=private_threadpool_size,
        max_intra_op_parallelism=max_intra_op_parallelism,
    )  # fmt: skip
    for name, value in pipeline_options.items():
        pipeline_options[name] = _validation.optional_positive_int(value, name)
    return _distribute_for(
        data, info, per_replica_batch_size=per_replica_batch_size, global_batch_size=global_batch_size,
        shuffle=shuffle, seed=seed, last_batch=last_batch, shard=shard, cache=cache, parse_fn=parse_fn,
        num_samples=num_samples, output_signature=output_signature, pipeline_options=pipeline_options,
    )  # fmt: skip


def _distribute_for(data, info, *, pipeline_options=None, **kwargs):
    """`distribute` for the worker that `info` (a `StrategyInfo`) describes."""
    plan, source, schedule, file_assignment = _make_plan(data, info, **kwargs)
    for message in plan.warnings:
        logger.warning("%s", message)
    logger.info("%s", plan)
    if not _passes.install() and plan.shuffle and plan.num_workers > 1:
        logger.warning("%s", UNNUMBERED_PASSES_WARNING)
    cache = kwargs.get("cache", False)
    build = functools.partial(
        _pipeline.build, source, plan, schedule, file_assignment, kwargs.get("parse_fn"),
        **(pipeline_options or {}),
    )  # fmt: skip
    dataset = build(cache=cache)
    setattr(dataset, _PLAN_ATTRIBUTE, plan)
    # A cache file belongs to the training pipeline; a copy caches in memory.
    setattr(dataset, _REBUILD_ATTRIBUTE, lambda: build(cache=bool(cache)))
    return dataset


def _independent_copy(dataset):
    """A `distribute` dataset built again (own pass counter, empty cache), else None."""
    rebuild = getattr(dataset, _REBUILD_ATTRIBUTE, None)
    return None if rebuild is None else rebuild()


def describe(data: Any, **kwargs: Any) -> InputPlan:
    """The input plan `distribute` would follow, without building the pipeline.

    Args:
        data: as for `distribute`, or a dataset `distribute` returned (whose
            plan is then returned).
        **kwargs: the other arguments of `distribute`.

    Returns:
        An `InputPlan`; `print(plan)` shows it as a short table.

    Raises:
        ValueError: a dataset of `distribute` with arguments; else as `distribute`.

    Example:

    ```python
    x = np.random.rand(1000, 8).astype("float32")
    plan = keras_scaling.data.describe((x, x), per_replica_batch_size=32, last_batch="pad")
    print(plan)   # ... steps per epoch: 32 last batch: pad: 0 dropped, 24 padded per epoch ...
    ```
    """
    existing = plan_of(data)
    if existing is not None:
        if kwargs:
            raise ValueError(
                f"describe() got a dataset of distribute(), which has its plan, and arguments {sorted(kwargs)}: pass the original data with the arguments, or the dataset alone."
            )
        return existing
    return _make_plan(data, devices.describe_strategy(kwargs.pop("strategy", None)), **kwargs)[0]


def plan_of(dataset: tf.data.Dataset) -> InputPlan | None:
    """The `InputPlan` of a dataset returned by `distribute`, else None.

    Datasets made from it (`.map(...)`) carry no plan.

    Args:
        dataset: a `tf.data.Dataset`, or any object.

    Returns:
        The `InputPlan`, or None.

    Example:

    ```python
    x = np.random.rand(1000, 8).astype("float32")
    train = keras_scaling.data.distribute((x, x), global_batch_size=64)
    keras_scaling.data.plan_of(train).steps_per_epoch   # 15
    keras_scaling.data.plan_of(train.map(lambda *batch: batch))   # None
    ```
    """
    return getattr(dataset, _PLAN_ATTRIBUTE, None)


def _make_plan(
    data, info, *, per_replica_batch_size=None, global_batch_size=None, shuffle=None, seed=None,
    last_batch="drop", shard="auto", cache=False, parse_fn=None, num_samples=None,
    output_signature=None,
):  # fmt: skip
    # TPUs need the same shapes on every step.
    static_shapes = info.device_kind == "TPU" or info.kind.startswith("TPU")
    _input_plan.check_last_batch(last_batch, info.num_workers, static_shapes)
    _validation.one_of(shard, "shard", _input_plan.SHARD_MODES)
    shuffle = _validation.optional_boolean(shuffle, "shuffle")
    seed = _validation.optional_integer(seed, "seed")
    if not (cache is False or cache is True or isinstance(cache, (str, os.PathLike))):
        raise TypeError(f"cache must be False, True (in memory) or a file path, got {cache!r}.")
    num_samples = _validation.optional_positive_int(
        num_samples, "num_samples", fix="Pass the samples in one pass, or None to count them."
    )
    sizes = dict(per_replica_batch_size=per_replica_batch_size, global_batch_size=global_batch_size)
    if per_replica_batch_size is not None or global_batch_size is not None:
        # Wrong sizes are reported before any data is read or counted.
        _input_plan.resolve_batch_sizes(info.num_replicas, **sizes)
    source = _sources.inspect_data(data, parse_fn, num_samples, output_signature)
    per_replica, global_size = _input_plan.resolve_batch_sizes(
        info.num_replicas, **sizes, data_batch_size=source.batch_size
    )
    unit = getattr(source, "unit", "files")
    shard_mode, shard_reason, shard_warning = _input_plan.choose_shard_mode(
        shard, info.num_workers, source.num_files, unit=unit
    )
    file_assignment = None
    if shard_mode == "item":
        file_assignment = _input_plan.assign_items(source.num_files, info.num_workers)
    elif shard_mode == "file":
        file_assignment = _input_plan.assign_files(source.file_sizes, info.num_workers)
    worker_sizes = [
        len(_input_plan.element_share(source.num_examples, info.num_workers, worker))
        if file_assignment is None
        else sum(source.file_sizes[i] for i in file_assignment[worker])
        for worker in range(info.num_workers)
    ]
    schedule = _input_plan.schedule_epoch(worker_sizes, global_size, last_batch)
    shuffle = source.default_shuffle if shuffle is None else shuffle
    small_batch = _input_plan.small_batch_warning(per_replica, info.device_kind)
    plan = InputPlan(
        num_examples=source.num_examples, num_replicas=info.num_replicas,
        num_workers=info.num_workers, worker_index=info.worker_index,
        per_replica_batch_size=per_replica, global_batch_size=global_size,
        steps_per_epoch=schedule.steps_per_epoch, last_batch=last_batch,
        shard_mode=shard_mode, shard_reason=shard_reason,
        samples_dropped_per_epoch=schedule.samples_dropped,
        samples_padded_per_epoch=schedule.samples_padded,
        worker_examples=schedule.examples_per_worker[info.worker_index],
        shuffle=shuffle, seed=DEFAULT_SEED if seed is None else int(seed),
        num_files=source.num_files,
        worker_files=len(file_assignment[info.worker_index]) if file_assignment else None,
        device_kind=info.device_kind, strategy=info.kind,
        warnings=tuple(message for message in (shard_warning, small_batch) if message),
        source_kind=source.kind, notes=_source_notes(source, shuffle, sizes, per_replica),
        file_unit=unit,
    )  # fmt: skip
    return plan, source, schedule, file_assignment


def _source_notes(source, shuffle, sizes_given, per_replica):
    notes = list(source.notes)
    if source.batch_size is not None:
        if all(size is None for size in sizes_given.values()):
            notes.append(
                f"per_replica_batch_size={per_replica} taken from the data's own batch (the size it was tuned for on one device); pass per_replica_batch_size= to change it"
            )
        notes.append(
            f"the data's batches of {source.batch_size} are unbatched and re-batched to the global batch"
        )
    if isinstance(source, _sources.DirectorySource):
        if source.shuffled and shuffle:
            notes.append(
                "the utility's own shuffle is replaced by the seeded shuffle of the files that every worker agrees on"
            )
        elif source.shuffled:
            notes.append("the utility's own shuffle is turned off (shuffle=False)")
        elif shuffle:
            notes.append("the files are shuffled with the seeded shuffle (shuffle=True)")
        notes.append("files are split between workers before decoding")
    return tuple(notes)
