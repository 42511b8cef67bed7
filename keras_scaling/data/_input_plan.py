"""The input plan: batch sizes, shards and steps, as pure arithmetic.

Nothing here touches TensorFlow, so every rule can be checked with plain
numbers. `keras_scaling.data.distribute` builds its pipeline from these
results and `keras_scaling.data.describe` prints them.
"""

import dataclasses
import math

from keras_scaling import _validation

LAST_BATCH_MODES = ("drop", "pad", "partial")
SHARD_MODES = ("auto", "file", "element")

# Below this many samples per replica an accelerator spends most of each step
# waiting for work; 32 is the smallest batch at which typical GPU kernels are
# reasonably efficient. CPUs are not warned about.
MIN_ACCELERATOR_PER_REPLICA_BATCH_SIZE = 32


def resolve_batch_sizes(
    num_replicas,
    per_replica_batch_size=None,
    global_batch_size=None,
    data_batch_size=None,
):
    """Derives the per-replica and the global batch size from one of them.

    The global batch is what one training step consumes across all replicas:
    `global_batch_size = per_replica_batch_size * num_replicas`. Pass exactly
    one of the two sizes (or both, when they agree). When neither is given,
    data that came batched lends its own batch size as the per-replica batch:
    the size its pipeline was tuned for on one device.

    For example, with 3 replicas, `per_replica_batch_size=32` gives
    `(32, 96)`, and `global_batch_size=96` gives the same; a
    `global_batch_size` of 100 is refused, because 100 samples cannot be split
    evenly over 3 replicas (99 or 102 can).

    Args:
        num_replicas: int, replicas in sync across all workers.
        per_replica_batch_size: int or None, samples per replica per step.
        global_batch_size: int or None, samples per step across all replicas.
        data_batch_size: int or None, the batch size the data came in.

    Returns:
        `(per_replica_batch_size, global_batch_size)`.

    Raises:
        ValueError: no size is given (nor the data's), a size is not a positive integer,
            the global batch is not divisible by the replicas, or the two
            sizes disagree.
    """
    if per_replica_batch_size is None and global_batch_size is None:
        if data_batch_size is not None:
            return data_batch_size, data_batch_size * num_replicas
        raise ValueError(
            "Pass per_replica_batch_size (samples per replica, e.g. 32) or "
            "global_batch_size (samples per step across all "
            f"{num_replicas} replicas); got neither."
        )
    if per_replica_batch_size is not None:
        per_replica_batch_size = _validation.positive_int(
            per_replica_batch_size,
            "per_replica_batch_size",
            fix="Pass for example per_replica_batch_size=32.",
        )
    if global_batch_size is not None:
        global_batch_size = _validation.positive_int(
            global_batch_size,
            "global_batch_size",
            fix="Pass for example global_batch_size=32.",
        )
        if global_batch_size % num_replicas:
            lower = global_batch_size // num_replicas * num_replicas
            options = f"{lower} or " if lower else ""
            raise ValueError(
                f"global_batch_size={global_batch_size} is not divisible by the "
                f"{num_replicas} replicas. Use a multiple of {num_replicas} "
                f"({options}{lower + num_replicas}), or pass "
                "per_replica_batch_size instead."
            )
    if per_replica_batch_size is None:
        return global_batch_size // num_replicas, global_batch_size
    derived = per_replica_batch_size * num_replicas
    if global_batch_size is not None and global_batch_size != derived:
        raise ValueError(
            f"per_replica_batch_size={per_replica_batch_size} and "
            f"global_batch_size={global_batch_size} disagree: with "
            f"{num_replicas} replicas the global batch is "
            f"{per_replica_batch_size} * {num_replicas} = {derived}. "
            "Pass only one of them."
        )
    return per_replica_batch_size, derived


def check_last_batch(last_batch, *, num_workers=1, static_shapes_required=False):
    """Validates `last_batch` for the given cluster; returns it.

    `"partial"` keeps a smaller last batch, so it cannot be used where every
    step must have the same shape (TPUs) or where every worker must run the
    same number of steps with unequal shares (several workers).
    """
    _validation.one_of(last_batch, "last_batch", LAST_BATCH_MODES)
    if last_batch == "partial" and static_shapes_required:
        raise ValueError(
            "last_batch='partial' gives the last step a smaller batch, but TPUs "
            "need the same shape on every step. Use last_batch='pad' (every "
            "sample counted once, padding has weight 0) or 'drop'."
        )
    if last_batch == "partial" and num_workers > 1:
        raise ValueError(
            f"last_batch='partial' cannot give all {num_workers} workers the "
            "same number of steps, and a worker that stops early leaves the "
            "others waiting. Use last_batch='pad' (every sample counted once, "
            "padding has weight 0) or 'drop'."
        )
    return last_batch


def check_shard(shard):
    """Validates `shard`; returns it."""
    return _validation.one_of(shard, "shard", SHARD_MODES)


def check_shuffle(shuffle):
    """Validates `shuffle` (True, False or None for the default); returns it as a bool or None."""
    return _validation.optional_boolean(shuffle, "shuffle")


def check_seed(seed):
    """Validates `seed` (an integer or None); returns it as an int or None."""
    return _validation.optional_integer(seed, "seed")


def choose_shard_mode(shard, num_workers, num_files=None, unit="files"):
    """Decides how the data is split between workers, and says why.

    - One worker: nothing to split (`"none"`).
    - Files, with at least as many files as workers: each worker reads only
      its own files (`"file"`), the cheapest split.
    - Otherwise every worker reads the records and keeps every
      `num_workers`-th one (`"element"`), before parsing, so each worker
      parses only its own share.

    - Items of a `keras.utils.PyDataset` (`unit="items"`) are split like
      files (`"item"`): each worker reads only its own items.

    For example, 8 files on 3 workers give `"file"` (workers read 3, 3 and 2
    files); 2 files on 3 workers give `"element"`, and a warning, because
    every worker then reads all records.

    Args:
        shard: `"auto"`, `"file"` or `"element"`.
        num_workers: int, the number of workers.
        num_files: int or None, the number of input files or items (None for
            in-memory data and datasets).
        unit: `"files"` or `"items"`, what `num_files` counts.

    Returns:
        `(shard_mode, shard_reason, warning)`, where `warning` is a message
        or None.

    Raises:
        ValueError: an unknown `shard`, or `shard="file"` without enough
            files.
    """
    check_shard(shard)
    if shard == "file" and num_files is None:
        raise ValueError(
            "shard='file' needs a list of TFRecord files, a dataset of Keras' "
            "directory utilities or a PyDataset as data; arrays and other "
            "datasets are split by element. Use shard='auto'."
        )
    if num_workers == 1:
        return "none", "one worker: nothing to shard", None
    mode = "file" if unit == "files" else "item"
    if num_files is not None and num_files >= num_workers and shard != "element":
        return (
            mode,
            f"{num_files} {unit} >= {num_workers} workers: each worker reads only its own {unit}",
            None,
        )
    if shard == "file":
        raise ValueError(
            f"shard='file' needs at least one of the data's {unit} per worker, "
            f"but there are {num_files} {unit} for {num_workers} workers. Split "
            f"the data into at least {num_workers} {unit}, or use shard='auto' "
            "to split by element."
        )
    if num_files is None:
        return (
            "element",
            f"in-memory data or dataset: each worker keeps one element in {num_workers}",
            None,
        )
    if shard == "element":
        return (
            "element",
            "shard='element' requested: every worker reads all records and "
            f"keeps one in {num_workers} before parsing",
            None,
        )
    singular = unit[:-1]
    warning = (
        f"Only {num_files} {singular}(s) for {num_workers} workers: falling back "
        "to element sharding, so every worker reads all samples (and parses only "
        f"its own). Split the data into at least {num_workers} {unit} to let "
        "each worker read only its own."
    )
    return (
        "element",
        f"{num_files} {unit} < {num_workers} workers: every worker reads all "
        f"samples and keeps one in {num_workers} before parsing",
        warning,
    )


def element_share(num_examples, num_workers, worker_index):
    """The element positions a worker takes under element sharding.

    Worker `i` of `W` takes positions `i, i + W, i + 2W, ...` of the epoch's
    order (which, when shuffled, is the same permutation on every worker), so
    the shares are disjoint, cover every position, and differ in size by at
    most one. For example, 10 elements on 3 workers give
    `range(0, 10, 3)` = [0, 3, 6, 9], [1, 4, 7] and [2, 5, 8].

    Returns:
        A `range` of positions.
    """
    return range(worker_index, num_examples, num_workers)


def assign_files(file_sizes, num_workers):
    """Assigns whole files to workers so their record counts are balanced.

    Files are taken largest first and each goes to the worker with the fewest
    records so far (ties go to the lower worker index), which is the same on
    every worker given the same list. For example, sizes `[5, 3, 3, 2]` on 2
    workers give `[[0, 3], [1, 2]]`: 7 and 6 records.

    Args:
        file_sizes: list of int, the records in each file.
        num_workers: int.

    Returns:
        A list, per worker, of file indices in their original order.
    """
    loads = [0] * num_workers
    assignment: list[list[int]] = [[] for _ in range(num_workers)]
    order = sorted(range(len(file_sizes)), key=lambda i: (-file_sizes[i], i))
    for file_index in order:
        worker = min(range(num_workers), key=lambda w: (loads[w], w))
        assignment[worker].append(file_index)
        loads[worker] += file_sizes[file_index]
    return [sorted(files) for files in assignment]


def assign_items(num_items, num_workers):
    """Splits the items of a `PyDataset` between workers by index.

    Worker `w` of `W` reads items `w, w + W, w + 2W, ...`, so every item is
    read once per epoch, by one worker. For example, 7 items on 3 workers
    give `[[0, 3, 6], [1, 4], [2, 5]]`.

    Returns:
        A list, per worker, of item indices.
    """
    return [list(range(worker, num_items, num_workers)) for worker in range(num_workers)]


@dataclasses.dataclass(frozen=True)
class EpochSchedule:
    """How many steps an epoch has and what each worker reads for it.

    Args:
        steps_per_epoch: global steps per epoch, the same on every worker.
        examples_per_worker: real samples each worker yields per epoch.
        padding_per_worker: zero-weight rows each worker adds per epoch.
        samples_dropped: samples left out per epoch, over all workers.
        samples_padded: zero-weight rows added per epoch, over all workers.
    """

    steps_per_epoch: int
    examples_per_worker: tuple
    padding_per_worker: tuple
    samples_dropped: int
    samples_padded: int


def schedule_epoch(worker_sizes, global_batch_size, last_batch):
    """Gives every worker the same number of steps from unequal shares.

    Under `tf.distribute`, each worker's dataset yields batches of the global
    batch size `G`, which TensorFlow cuts into per-replica pieces; with `W`
    workers each worker consumes `G / W` samples per step, so one of its
    batches lasts `W` steps. For every worker to stop after the same step
    with static shapes, each worker yields the same whole number `k` of
    batches of `G` per epoch, and the epoch has `k * W` steps:

    - `"drop"`: `k = min(n_w) // G`; each worker leaves out `n_w - k * G`.
    - `"pad"`: `k = ceil(max(n_w) / G)`; each worker adds `k * G - n_w`
      zero-weight rows.
    - `"partial"` (one worker only): `ceil(n / G)` steps, the last one with
      the `n % G` remaining samples.

    Worked example: 1001 samples on 2 workers (shares 501 and 500) with
    `G = 32`: `"drop"` gives `k = 15`, 30 steps, each worker reads 480, and
    41 samples are left out; `"pad"` gives `k = 16`, 32 steps, with 11 and 12
    padding rows. On one worker with 3 replicas and `G = 96`, 1001 samples
    give 10 steps and 41 dropped (`"drop"`), 11 steps and 55 padded
    (`"pad"`), or 11 steps with a last batch of 41 (`"partial"`).

    Args:
        worker_sizes: list of int, the samples in each worker's share.
        global_batch_size: int, `G`.
        last_batch: `"drop"`, `"pad"` or `"partial"`.

    Returns:
        An `EpochSchedule`.

    Raises:
        ValueError: the data is empty, or `"drop"` leaves no full step.
    """
    num_workers = len(worker_sizes)
    total = sum(worker_sizes)
    if total == 0:
        raise ValueError("data is empty: there is nothing to train on.")
    if last_batch == "partial":
        if num_workers != 1:
            check_last_batch(last_batch, num_workers=num_workers)
        steps = math.ceil(total / global_batch_size)
        return EpochSchedule(
            steps_per_epoch=steps,
            examples_per_worker=(total,),
            padding_per_worker=(0,),
            samples_dropped=0,
            samples_padded=0,
        )
    if last_batch == "drop":
        batches_per_worker = min(worker_sizes) // global_batch_size
        if batches_per_worker == 0:
            smallest = min(worker_sizes)
            where = (
                f"the smallest of the {num_workers} workers' shares has {smallest}"
                if num_workers > 1
                else f"the data has {total} samples"
            )
            raise ValueError(
                f"last_batch='drop' leaves no full step: {where}, fewer than one "
                f"global batch of {global_batch_size}. Use a smaller batch size "
                "or last_batch='pad'."
            )
        kept = batches_per_worker * global_batch_size
        examples = tuple(kept for _ in worker_sizes)
        padding = tuple(0 for _ in worker_sizes)
    else:
        batches_per_worker = max(math.ceil(size / global_batch_size) for size in worker_sizes)
        examples = tuple(worker_sizes)
        padding = tuple(batches_per_worker * global_batch_size - size for size in worker_sizes)
    return EpochSchedule(
        steps_per_epoch=batches_per_worker * num_workers,
        examples_per_worker=examples,
        padding_per_worker=padding,
        samples_dropped=total - sum(examples),
        samples_padded=sum(padding),
    )


def small_batch_warning(per_replica_batch_size, device_kind):
    """A warning when the per-replica batch is too small for an accelerator.

    Each replica runs on its own device, so the per-replica batch is the work
    one device gets per step. On GPUs and TPUs fewer than
    `MIN_ACCELERATOR_PER_REPLICA_BATCH_SIZE` (32) samples leave it mostly
    idle; on CPUs nothing is said.

    Returns:
        The message, or None.
    """
    if device_kind == "CPU":
        return None
    if per_replica_batch_size >= MIN_ACCELERATOR_PER_REPLICA_BATCH_SIZE:
        return None
    return (
        f"per_replica_batch_size={per_replica_batch_size} is small for a "
        f"{device_kind}: each device gets {per_replica_batch_size} samples per "
        "step and spends most of the step waiting. Use at least "
        f"{MIN_ACCELERATOR_PER_REPLICA_BATCH_SIZE} per replica if memory allows."
    )


@dataclasses.dataclass(frozen=True)
class InputPlan:
    """What `keras_scaling.data.distribute` feeds to each step, and why.

    `str(plan)` is a short readable table; `distribute` logs it once.

    Args:
        num_examples: samples in the data, over all workers.
        num_replicas: replicas in sync across all workers.
        num_workers: workers (machines or processes).
        worker_index: this worker's index.
        per_replica_batch_size: samples per replica per step.
        global_batch_size: samples per step over all replicas; the batch
            size of the dataset `distribute` returns.
        steps_per_epoch: steps in one epoch, the same on every worker.
        last_batch: `"drop"`, `"pad"` or `"partial"`.
        shard_mode: `"none"`, `"file"`, `"item"` (a `PyDataset`'s items) or
            `"element"`.
        shard_reason: why that shard mode was chosen.
        samples_dropped_per_epoch: samples left out per epoch (`"drop"`).
        samples_padded_per_epoch: zero-weight rows added per epoch (`"pad"`).
        worker_examples: real samples this worker yields per epoch.
        shuffle: whether the order is shuffled every epoch.
        seed: the shuffle seed, the same on every worker.
        num_files: input files (or `PyDataset` items), or None for arrays
            and datasets.
        worker_files: files (or items) this worker reads, or None.
        device_kind: `"CPU"`, `"GPU"` or `"TPU"`.
        strategy: the strategy's class name.
        warnings: messages worth a user's attention (also logged).
        source_kind: what the data is, in words (`"arrays"`, `"batched
            tf.data.Dataset (.batch(), batch 32)"`, ...).
        notes: how the batch size, the count and the shuffle were decided
            for this data.
        file_unit: `"files"`, or `"items"` for a `PyDataset`.

    Example:

    ```python
    import numpy as np, tensorflow as tf, keras_scaling
    strategy = tf.distribute.get_strategy()   # one device
    x = np.random.rand(1000, 8).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    plan = keras_scaling.data.describe(
        (x, y), strategy=strategy, per_replica_batch_size=32
    )
    plan.global_batch_size, plan.steps_per_epoch   # (32, 31)
    print(plan)
    ```
    """

    num_examples: int
    num_replicas: int
    num_workers: int
    worker_index: int
    per_replica_batch_size: int
    global_batch_size: int
    steps_per_epoch: int
    last_batch: str
    shard_mode: str
    shard_reason: str
    samples_dropped_per_epoch: int
    samples_padded_per_epoch: int
    worker_examples: int
    shuffle: bool
    seed: int
    num_files: int | None = None
    worker_files: int | None = None
    device_kind: str = "CPU"
    strategy: str = ""
    warnings: tuple[str, ...] = ()
    source_kind: str = "arrays"
    notes: tuple[str, ...] = ()
    file_unit: str = "files"

    @property
    def per_worker_batch_size(self) -> int:
        """Samples each worker feeds to its replicas per step."""
        return self.global_batch_size // self.num_workers

    def __str__(self) -> str:
        workers = "worker" if self.num_workers == 1 else "workers"
        lines = [
            f"Input plan ({self.strategy}, {self.device_kind}):",
            f"  replicas:         {self.num_replicas} on {self.num_workers} "
            f"{workers}"
            + (f" (this is worker {self.worker_index})" if self.num_workers > 1 else ""),
            f"  batch:            {self.per_replica_batch_size} per replica x "
            f"{self.num_replicas} replica{'' if self.num_replicas == 1 else 's'} = "
            f"{self.global_batch_size} global",
            f"  data:             {self.source_kind}",
            f"  samples:          {self.num_examples}"
            + (f" in {self.num_files} {self.file_unit}" if self.num_files is not None else ""),
            f"  shard:            {self.shard_mode} ({self.shard_reason})",
            f"  steps per epoch:  {self.steps_per_epoch}",
            f"  last batch:       {self.last_batch}: "
            f"{self.samples_dropped_per_epoch} dropped, "
            f"{self.samples_padded_per_epoch} padded per epoch",
            "  shuffle:          " + (f"every epoch, seed {self.seed}" if self.shuffle else "no"),
        ]
        if self.num_workers > 1:
            files = (
                f" from {self.worker_files} {self.file_unit}"
                if self.worker_files is not None
                else ""
            )
            lines.append(
                f"  this worker:      {self.worker_examples} samples{files}, "
                f"{self.per_worker_batch_size} per step"
            )
        lines.extend(f"  note: {message}" for message in self.notes)
        lines.extend(f"  warning: {message}" for message in self.warnings)
        return "\n".join(lines)
