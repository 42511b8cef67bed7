"""Distributed input: shard per worker, batch globally, prefetch, static shapes.

`distribute` turns arrays, a `tf.data.Dataset` (batched or not, including
those of Keras' dataset utilities), a `keras.utils.PyDataset`, a generator
function or TFRecord files into a dataset that `model.fit`, `evaluate` and `predict` can use under any
`tf.distribute` strategy, with an explicit plan (`describe`, `plan_of`) of
what each replica and worker reads.
"""

import logging
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_scaling import _validation, devices
from keras_scaling.data import _input_plan, _keras_epochs, _passes, _pipeline, _sources
from keras_scaling.data._input_plan import InputPlan

__all__ = ["InputPlan", "describe", "distribute", "global_batch_size", "plan_of"]

logger = logging.getLogger("keras_scaling")

# Every worker must draw the same order, so an unseeded shuffle is never used:
# `seed=None` means this seed, and each epoch still gets a new order.
DEFAULT_SEED = 1234

_PLAN_ATTRIBUTE = "_keras_scaling_input_plan"

# A callable building the same pipeline again, with shuffle state of its own.
_REBUILD_ATTRIBUTE = "_keras_scaling_rebuild"

UNNUMBERED_PASSES_WARNING = (
    "keras_scaling.data: Keras' epochs cannot number the passes over this "
    "dataset here (the warning above says why, or KERAS_SCALING_NO_COMPAT=1): "
    "each pass takes its shuffle order when this process starts reading it, "
    "so a batch read outside fit on one worker alone (next(iter(dataset))) "
    "makes the workers read different samples. Read it only through fit, "
    "evaluate and predict, the same on every worker."
)


def global_batch_size(
    per_replica_batch_size: int, strategy: tf.distribute.Strategy | None = None
) -> int:
    """The global batch size for a per-replica batch size under a strategy.

    One training step consumes `per_replica_batch_size` samples on each of
    the strategy's `num_replicas_in_sync` replicas, across all workers.

    Args:
        per_replica_batch_size: int, samples per replica per step.
        strategy: a `tf.distribute.Strategy`; defaults to the current one
            (`tf.distribute.get_strategy()`).

    Returns:
        int, `per_replica_batch_size * strategy.num_replicas_in_sync`.

    Example:

    ```python
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    keras_scaling.data.global_batch_size(32, strategy)   # 64
    ```
    """
    info, _ = _describe_strategy(strategy)
    return _input_plan.resolve_batch_sizes(
        info.num_replicas, per_replica_batch_size=per_replica_batch_size
    )[1]


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

    The returned `tf.data.Dataset` yields batches of `global_batch_size`
    samples drawn from this worker's share of the data; pass it to
    `model.fit`, `model.evaluate` or `model.predict` (Keras splits each batch
    between the replicas). Its plan, from `plan_of(dataset)`, is logged once
    at INFO level on the `keras_scaling` logger, and
    `keras_scaling.compat.enable_for(strategy)` is applied.

    What it guarantees:

    - Sharding is planned, not left to TensorFlow's AUTO policy: with several
      workers, TFRecord files are split between workers when there are at
      least as many files as workers; otherwise every worker keeps every
      `num_workers`-th element before `parse_fn` runs (a warning gives the
      counts). TensorFlow's own sharding is turned off on the result.
    - Each sample is read exactly once per epoch over all workers (except
      those left out by `last_batch="drop"`), and every worker runs the same
      number of steps.
    - Shuffling is seeded: every worker draws the same permutation of the
      whole data and keeps its own part; each epoch has a new order; the
      same seed gives the same orders. Arrays get a full permutation;
      datasets and records a shuffle buffer of up to 10 000 elements. The
      order of a pass over the dataset is a function of the seed and the
      pass's number alone, and Keras' epochs number the passes (each
      epoch of `fit`, each `evaluate` and `predict`, counted in each
      process): every worker reads epoch `e` of `fit` in the same order,
      whatever it read outside Keras (a look at a batch before training).
      Where Keras' epochs cannot be seen (a warning says so) a pass is
      numbered when its first batch is read. `fit(shuffle=True)` does not apply to a
      dataset, and Keras' warning that it is ignored does not appear for a
      dataset `distribute` shuffles.
    - Shapes are static except for the last batch under
      `last_batch="partial"`; the pipeline ends with
      `prefetch(tf.data.AUTOTUNE)` (or `prefetch_batches`). Its maps run
      with `num_parallel_calls=tf.data.AUTOTUNE`.

    `last_batch` decides what happens to the samples that do not fill a
    last global batch:

    - `"drop"`: they are left out (a different few each epoch when
      shuffled). Every batch is full and every replica gets
      `per_replica_batch_size` samples.
    - `"pad"`: the last batch is filled with copies of a sample with
      `sample_weight` 0, and every real sample has weight 1 (multiplied into
      a `sample_weight` you give), so `evaluate` counts each sample exactly
      once in `weighted_metrics` (Keras applies sample weights to the loss
      and to `compile(weighted_metrics=...)`, not to `metrics=`). Keras'
      `loss` sums the weighted losses but divides by every row, padding
      included: the mean over the real samples is
      `loss * (num_examples + samples_padded_per_epoch) / num_examples`
      (numbers from `plan_of(dataset)`). Data without targets (`x` alone,
      for `predict`) gets no weights: on one worker the extra predictions
      are at the end, so keep the first `num_examples` (with
      `shuffle=False`); with several workers the workers' rows alternate and
      the padding is mixed in, so predict with a single worker.
    - `"partial"`: the last batch is smaller and TensorFlow splits it over the
      replicas, so some replicas can get fewer or no samples in that step.
      Refused under TPUs (static shapes) and with several workers (the
      workers would run different numbers of steps).

    With several workers, TensorFlow cuts each worker's batch (of the global
    size) into per-replica pieces for all replicas, and each worker feeds
    only its own replicas, so one batch lasts `num_workers` steps: an epoch
    is `plan.steps_per_epoch` steps, `num_workers` times
    `dataset.cardinality()`. So that every worker stops after the same step
    with static shapes, the epoch is a whole number of batches on every
    worker: up to `num_workers - 1` more global batches are dropped or padded
    than on one worker. `describe` shows the exact numbers. Every worker
    must call `distribute` with the same data and arguments.

    Data that comes batched (a pipeline ending in `.batch(32)`, and every
    dataset of Keras' `image_dataset_from_directory`,
    `text_dataset_from_directory`, `audio_dataset_from_directory` and
    `timeseries_dataset_from_array`) is unbatched and re-batched to the
    global batch; with no batch size given, its own batch is taken as the
    per-replica batch (the size it was tuned for on one device), and the plan
    says so. The number of samples is found the cheapest exact way: the
    dataset's cardinality, the elements before its `.batch()`, the
    `file_paths` of Keras' directory utilities, record counts of TFRecord
    files, `len()` of a `PyDataset` and its last item; failing those, one
    counting pass over the data (its expected duration logged first, then a
    progress bar), unless `num_samples` states it.

    Args:
        data: what to read:
            - NumPy arrays (or tensors) as `model.fit` takes them: `x`,
              `(x, y)` or `(x, y, sample_weight)`, where `x` and `y` may be
              arrays, lists or dicts of arrays;
            - a `tf.data.Dataset`, batched or not, yielding `x`, `(x, y)` or
              `(x, y, sample_weight)`. A dataset of Keras' directory
              utilities is split between workers by file, before decoding;
              its own shuffle is replaced by the seeded one (`shuffle=None`
              keeps its choice to shuffle or not). Other datasets are split
              by element;
            - a `keras.utils.PyDataset`: each item is a batch. Worker `w` of
              `W` reads items `w, w + W, ...`, with the dataset's own
              `workers`, `use_multiprocessing` and `max_queue_size`; every
              item must have item 0's structure and sample shapes, and all
              but the last its batch size. `on_epoch_begin` and
              `on_epoch_end` are called around every epoch, as Keras does
              (`on_epoch_end` once every item is read: a pass given up
              early ends no epoch, unless the pipeline's read-ahead, a few
              global batches, already read every item of a smaller dataset);
            - a generator function yielding samples, with `output_signature`
              (and best `num_samples`);
            - a list of TFRecord file paths, with `parse_fn`. The files are
              read once here to count their records (no parsing).
        strategy: a `tf.distribute.Strategy`; defaults to the current one
            (`tf.distribute.get_strategy()`).
        per_replica_batch_size: int, samples per replica per step.
        global_batch_size: int, samples per step over all replicas; must be a
            multiple of the number of replicas. Give exactly one of the two
            (or both, if they agree), or neither for batched data, whose
            batch is then the per-replica batch.
        shuffle: bool. Defaults to `None`: shuffle arrays and files (as
            `model.fit(shuffle=True)` does), keep a dataset's and a
            `PyDataset`'s own order (as `fit` does), shuffle the files of a
            directory utility that shuffled them. Pass `shuffle=False` for
            `evaluate` and `predict`.
        seed: int, the shuffle seed, the same on every worker. Defaults to
            `None`: a fixed seed (1234), so runs repeat the same orders; pass
            another seed for other orders.
        last_batch: `"drop"` (default), `"pad"` or `"partial"`, see above.
        shard: `"auto"` (default: by file when there are at least as many
            files as workers, else by element), `"file"` (refuses too few
            files) or `"element"`.
        cache: `False` (default), `True` (in memory) or a file path: cache the
            parsed samples of this worker's share after the first epoch. The
            split between workers is then fixed and each worker shuffles its
            own share.
        parse_fn: function from one element (a serialized record, for files)
            to the sample `x`, `(x, y)` or `(x, y, sample_weight)`; runs on
            this worker's share only, after sharding. Required for files.
        num_samples: int, the samples in one pass over the data, for data
            whose length is not known (a generator, a `.filter()`ed dataset):
            it saves the counting pass. TensorFlow checks it as the data is
            read; where the length is known, a different value is refused.
        output_signature: the `tf.TensorSpec` structure of one sample, when
            `data` is a generator function (as for
            `tf.data.Dataset.from_generator`).
        prefetch_batches: int, global batches read ahead at the end of the
            pipeline. Defaults to `None`: `tf.data.AUTOTUNE`.
        private_threadpool_size: int, threads of a pool of the pipeline's
            own (`tf.data.Options().threading.private_threadpool_size`).
            Defaults to `None`: TensorFlow's shared pool.
        max_intra_op_parallelism: int, threads one of the pipeline's ops
            may use (`tf.data.Options().threading.max_intra_op_parallelism`).
            Defaults to `None`: TensorFlow's choice.
            These three change how fast batches come, never which batches
            or in which order.

    Returns:
        A `tf.data.Dataset` of global batches, carrying its `InputPlan`
        (`keras_scaling.data.plan_of(dataset)`).

    Raises:
        TypeError: `strategy` is not a strategy, `parse_fn` is not callable,
            `data` is of an unsupported type or a generator object, or
            `output_signature` comes without a generator function.
        ValueError: batch sizes missing, not positive integers, inconsistent
            or not divisible by the replicas; an infinite or empty dataset;
            batches padded or grouped by shape, which cannot be re-batched;
            a `num_samples` that contradicts the data; `PyDataset` items
            that disagree with item 0; arrays of different lengths; files
            without `parse_fn` or missing; an unknown `last_batch` or
            `shard`; too little data for one step under `"drop"`.

    Example:

    ```python
    import keras, numpy as np, keras_scaling
    keras_scaling.use_logical_cpus(2)
    strategy = keras_scaling.auto_strategy()
    x = np.random.rand(1000, 8).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    train = keras_scaling.data.distribute(
        (x, y), strategy=strategy, per_replica_batch_size=32
    )
    print(keras_scaling.data.plan_of(train))
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    model.fit(train, epochs=2)
    ```
    """
    devices.warn_if_keras_distribution_set()
    info, strategy = _describe_strategy(strategy)
    from keras_scaling import compat

    compat.enable_for(strategy)
    pipeline_options = {
        name: _validation.optional_positive_int(value, name)
        for name, value in (
            ("prefetch_batches", prefetch_batches),
            ("private_threadpool_size", private_threadpool_size),
            ("max_intra_op_parallelism", max_intra_op_parallelism),
        )
    }
    return _distribute_for(
        data,
        info,
        static_shapes_required=_needs_static_shapes(strategy, info),
        per_replica_batch_size=per_replica_batch_size,
        global_batch_size=global_batch_size,
        shuffle=shuffle,
        seed=seed,
        last_batch=last_batch,
        shard=shard,
        cache=cache,
        parse_fn=parse_fn,
        num_samples=num_samples,
        output_signature=output_signature,
        pipeline_options=pipeline_options,
    )


def _distribute_for(data, info, *, static_shapes_required=False, pipeline_options=None, **kwargs):
    """`distribute` for the worker that `info` (a `StrategyInfo`) describes."""
    plan, source, schedule, file_assignment = _make_plan(
        data, info, static_shapes_required=static_shapes_required, **kwargs
    )
    for message in plan.warnings:
        logger.warning("%s", message)
    logger.info("%s", plan)
    if not _keras_epochs.install() and plan.shuffle and plan.num_workers > 1:
        logger.warning("%s", UNNUMBERED_PASSES_WARNING)
    counter = _passes.PassCounter()
    dataset = _pipeline.build(
        source,
        plan=plan,
        schedule=schedule,
        file_assignment=file_assignment,
        parse_fn=kwargs.get("parse_fn"),
        cache=kwargs.get("cache", False),
        counter=counter,
        **(pipeline_options or {}),
    )
    setattr(dataset, _PLAN_ATTRIBUTE, plan)
    _passes.attach(dataset, counter)
    cache = kwargs.get("cache", False)

    def rebuild():
        return _pipeline.build(
            source,
            plan=plan,
            schedule=schedule,
            file_assignment=file_assignment,
            parse_fn=kwargs.get("parse_fn"),
            # A cache file belongs to the training pipeline; a copy caches in memory.
            cache=bool(cache),
            counter=_passes.PassCounter(),
            **(pipeline_options or {}),
        )

    setattr(dataset, _REBUILD_ATTRIBUTE, rebuild)
    return dataset


def _independent_copy(dataset):
    """The pipeline of a `distribute` dataset built again, or None for other datasets.

    The copy reads the same source through the same steps, but its pass
    counter and cache are its own: iterating it does not advance the order
    the training dataset draws next. A cache starts empty.
    """
    rebuild = getattr(dataset, _REBUILD_ATTRIBUTE, None)
    return None if rebuild is None else rebuild()


def describe(data: Any, **kwargs: Any) -> InputPlan:
    """The input plan `distribute` would follow, without building the pipeline.

    Pass the same arguments as to `distribute`, or a dataset `distribute`
    returned (then its plan is returned). The plan says how many replicas and
    workers read the data, the per-replica and global batch, the shard mode
    and why it was chosen, the steps per epoch and the samples dropped or
    padded per epoch; `print(plan)` shows it as a short table.

    Args:
        data: as for `distribute`, or a dataset returned by `distribute`.
        **kwargs: the other arguments of `distribute`.

    Returns:
        An `InputPlan`.

    Example:

    ```python
    import numpy as np, tensorflow as tf, keras_scaling
    x = np.random.rand(1000, 8).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    plan = keras_scaling.data.describe(
        (x, y),
        strategy=tf.distribute.get_strategy(),
        per_replica_batch_size=32,
        last_batch="pad",
    )
    print(plan)   # ... steps per epoch: 32 last batch: pad: 0 dropped, 24 padded per epoch ...
    ```
    """
    existing = plan_of(data)
    if existing is not None:
        if kwargs:
            raise ValueError(
                "describe() got a dataset that distribute() built, which has "
                f"its plan already, and arguments {sorted(kwargs)}: pass the "
                "original data with the arguments, or the dataset alone."
            )
        return existing
    strategy = kwargs.pop("strategy", None)
    info, strategy = _describe_strategy(strategy)
    return _make_plan(
        data,
        info,
        static_shapes_required=_needs_static_shapes(strategy, info),
        **kwargs,
    )[0]


def plan_of(dataset: tf.data.Dataset) -> InputPlan | None:
    """The `InputPlan` of a dataset returned by `distribute`, else None.

    Transformations applied after `distribute` (such as `.map`) return new
    datasets without the plan.

    Args:
        dataset: a `tf.data.Dataset`, or any object.

    Returns:
        The `InputPlan`, or None for a dataset `distribute` did not return.

    Example:

    ```python
    import numpy as np, keras_scaling
    x = np.random.rand(1000, 8).astype("float32")
    train = keras_scaling.data.distribute((x, x), global_batch_size=64)
    keras_scaling.data.plan_of(train).steps_per_epoch   # 15
    keras_scaling.data.plan_of(train.map(lambda *batch: batch))   # None
    ```
    """
    return getattr(dataset, _PLAN_ATTRIBUTE, None)


def _strategy_or_current(strategy):
    return tf.distribute.get_strategy() if strategy is None else strategy


def _describe_strategy(strategy):
    strategy = _strategy_or_current(strategy)
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(
            "strategy must be a tf.distribute.Strategy (or None for the "
            f"current one), got {type(strategy).__name__}. Create one with "
            "keras_scaling.auto_strategy()."
        )
    return devices.describe_strategy(strategy), strategy


def _needs_static_shapes(strategy, info):
    return isinstance(strategy, tf.distribute.TPUStrategy) or info.device_kind == "TPU"


def _make_plan(
    data,
    info,
    *,
    static_shapes_required=False,
    per_replica_batch_size=None,
    global_batch_size=None,
    shuffle=None,
    seed=None,
    last_batch="drop",
    shard="auto",
    cache=False,
    parse_fn=None,
    num_samples=None,
    output_signature=None,
):
    _input_plan.check_last_batch(
        last_batch,
        num_workers=info.num_workers,
        static_shapes_required=static_shapes_required,
    )
    _input_plan.check_shard(shard)
    shuffle = _input_plan.check_shuffle(shuffle)
    seed = _input_plan.check_seed(seed)
    if not (cache is False or cache is True or isinstance(cache, str)):
        raise TypeError(f"cache must be False, True (in memory) or a file path, got {cache!r}.")
    _sources.check_num_samples(num_samples)
    if per_replica_batch_size is not None or global_batch_size is not None:
        # Wrong sizes are reported before any data is read or counted.
        _input_plan.resolve_batch_sizes(
            info.num_replicas,
            per_replica_batch_size=per_replica_batch_size,
            global_batch_size=global_batch_size,
        )
    source = _sources.inspect_data(
        data, parse_fn, num_samples=num_samples, output_signature=output_signature
    )
    per_replica, global_size = _input_plan.resolve_batch_sizes(
        info.num_replicas,
        per_replica_batch_size=per_replica_batch_size,
        global_batch_size=global_batch_size,
        data_batch_size=source.batch_size,
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
    if file_assignment is not None:
        worker_sizes = [
            sum(source.file_sizes[index] for index in files) for files in file_assignment
        ]
    else:
        worker_sizes = [
            len(_input_plan.element_share(source.num_examples, info.num_workers, worker))
            for worker in range(info.num_workers)
        ]
    schedule = _input_plan.schedule_epoch(worker_sizes, global_size, last_batch)
    if shuffle is None:
        shuffle = source.default_shuffle
    notes = _source_notes(source, shuffle, per_replica_batch_size, global_batch_size, per_replica)
    warnings = tuple(
        message
        for message in (
            shard_warning,
            _input_plan.small_batch_warning(per_replica, info.device_kind),
        )
        if message
    )
    plan = InputPlan(
        num_examples=source.num_examples,
        num_replicas=info.num_replicas,
        num_workers=info.num_workers,
        worker_index=info.worker_index,
        per_replica_batch_size=per_replica,
        global_batch_size=global_size,
        steps_per_epoch=schedule.steps_per_epoch,
        last_batch=last_batch,
        shard_mode=shard_mode,
        shard_reason=shard_reason,
        samples_dropped_per_epoch=schedule.samples_dropped,
        samples_padded_per_epoch=schedule.samples_padded,
        worker_examples=schedule.examples_per_worker[info.worker_index],
        shuffle=shuffle,
        seed=DEFAULT_SEED if seed is None else int(seed),
        num_files=source.num_files,
        worker_files=(len(file_assignment[info.worker_index]) if file_assignment else None),
        device_kind=info.device_kind,
        strategy=info.kind,
        warnings=warnings,
        source_kind=source.kind,
        notes=notes,
        file_unit=unit,
    )
    return plan, source, schedule, file_assignment


def _source_notes(source, shuffle, per_replica_given, global_given, per_replica):
    """What the plan says about the data: batch, count and shuffle decisions."""
    notes = list(source.notes)
    if source.batch_size is not None:
        if per_replica_given is None and global_given is None:
            notes.append(
                f"per_replica_batch_size={per_replica} taken from the data's own "
                "batch (the size it was tuned for on one device); pass "
                "per_replica_batch_size= to change it"
            )
        notes.append(
            f"the data's batches of {source.batch_size} are unbatched and "
            "re-batched to the global batch"
        )
    if isinstance(source, _sources.DirectorySource):
        if source.shuffled and shuffle:
            notes.append(
                "the utility's own shuffle is replaced by the seeded shuffle of "
                "the files that every worker agrees on"
            )
        elif source.shuffled:
            notes.append("the utility's own shuffle is turned off (shuffle=False)")
        elif shuffle:
            notes.append("the files are shuffled with the seeded shuffle (shuffle=True)")
        notes.append("files are split between workers before decoding")
    return tuple(notes)
