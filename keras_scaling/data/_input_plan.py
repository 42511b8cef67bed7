"""The input plan: batch sizes, shards and steps, as pure arithmetic (no TensorFlow)."""

import dataclasses
import math

from keras_scaling import _validation
from keras_scaling._validation import positive_int

LAST_BATCH_MODES = ("drop", "pad", "partial")
SHARD_MODES = ("auto", "file", "element")

# The smallest batch at which typical GPU kernels keep the device busy.
MIN_ACCELERATOR_PER_REPLICA_BATCH_SIZE = 32


def resolve_batch_sizes(
    num_replicas, per_replica_batch_size=None, global_batch_size=None, data_batch_size=None
):
    """`(per_replica_batch_size, global_batch_size)` from either, or from the data's batch.

    With 3 replicas, `per_replica_batch_size=32` and `global_batch_size=96` both give `(32, 96)`;
    `global_batch_size=100` is refused (99 or 102), as are sizes that disagree or none at all.
    """
    if per_replica_batch_size is None and global_batch_size is None:
        if data_batch_size is not None:
            return data_batch_size, data_batch_size * num_replicas
        raise ValueError(
            f"Pass per_replica_batch_size (samples per replica, e.g. 32) or global_batch_size (samples per step across all {num_replicas} replicas); got neither."
        )
    fix = "Pass for example 32."
    if per_replica_batch_size is not None:
        per_replica_batch_size = positive_int(
            per_replica_batch_size, "per_replica_batch_size", fix=fix
        )
    if global_batch_size is not None:
        global_batch_size = positive_int(global_batch_size, "global_batch_size", fix=fix)
        if global_batch_size % num_replicas:
            lower = global_batch_size // num_replicas * num_replicas
            options = f"{lower} or " if lower else ""
            raise ValueError(
                f"global_batch_size={global_batch_size} is not divisible by the {num_replicas} replicas: use {options}{lower + num_replicas}, or pass per_replica_batch_size."
            )
        if per_replica_batch_size is None:
            return global_batch_size // num_replicas, global_batch_size
    derived = per_replica_batch_size * num_replicas
    if global_batch_size is not None and global_batch_size != derived:
        raise ValueError(
            f"per_replica_batch_size={per_replica_batch_size} and global_batch_size={global_batch_size} disagree: with {num_replicas} replicas the global batch is {per_replica_batch_size} * {num_replicas} = {derived}. Pass only one of them."
        )
    return per_replica_batch_size, derived


def check_last_batch(last_batch, num_workers=1, static_shapes_required=False):
    """Validates `last_batch`: `"partial"` is refused under TPUs and with several workers."""
    _validation.one_of(last_batch, "last_batch", LAST_BATCH_MODES)
    fix = "Use last_batch='pad' (every sample counted once, padding has weight 0) or 'drop'."
    if last_batch == "partial" and static_shapes_required:
        raise ValueError(
            f"last_batch='partial' gives the last step a smaller batch, but TPUs need the same shape on every step. {fix}"
        )
    if last_batch == "partial" and num_workers > 1:
        raise ValueError(
            f"last_batch='partial' cannot give all {num_workers} workers the same number of steps, and a worker that stops early leaves the others waiting. {fix}"
        )
    return last_batch


def choose_shard_mode(shard, num_workers, num_files=None, unit="files"):
    """`(shard_mode, shard_reason, warning or None)`: `"none"` on one worker; `"file"` (`"item"`
    for `unit="items"`) with at least as many files as workers; else `"element"` (warns if files)."""
    _validation.one_of(shard, "shard", SHARD_MODES)
    if shard == "file" and num_files is None:
        raise ValueError(
            "shard='file' needs a list of TFRecord files, a dataset of Keras' directory utilities or a PyDataset as data; arrays and other datasets are split by element. Use shard='auto'."
        )
    if num_workers == 1:
        return "none", "one worker: nothing to shard", None
    if num_files is not None and num_files >= num_workers and shard != "element":
        reason = f"{num_files} {unit} >= {num_workers} workers: each reads only its own {unit}"
        return ("file" if unit == "files" else "item"), reason, None
    if shard == "file":
        raise ValueError(
            f"shard='file' needs at least one of the data's {unit} per worker, but there are {num_files} {unit} for {num_workers} workers. Split the data into at least {num_workers} {unit}, or use shard='auto' to split by element."
        )
    if num_files is None:
        reason = f"in-memory data or dataset: each worker keeps one element in {num_workers}"
        return "element", reason, None
    if shard == "element":
        reason = f"shard='element' requested: every worker reads all records and keeps one in {num_workers} before parsing"
        return "element", reason, None
    warning = f"Only {num_files} {unit[:-1]}(s) for {num_workers} workers: falling back to element sharding, so every worker reads all samples (and parses only its own). Split the data into at least {num_workers} {unit} to let each worker read only its own."
    reason = f"{num_files} {unit} < {num_workers} workers: every worker reads all samples and keeps one in {num_workers} before parsing"
    return "element", reason, warning


def element_share(num_examples, num_workers, worker_index):
    """Positions `i, i + W, ...` of the epoch's order: 10 on 3 workers give [0, 3, 6, 9], [1, 4, 7], [2, 5, 8]."""
    return range(worker_index, num_examples, num_workers)


def assign_files(file_sizes, num_workers):
    """File indices per worker, balanced by records (largest file first to the least loaded):
    sizes `[5, 3, 3, 2]` on 2 workers give `[[0, 3], [1, 2]]`, 7 and 6 records."""
    loads = [0] * num_workers
    assignment: list[list[int]] = [[] for _ in range(num_workers)]
    order = sorted(range(len(file_sizes)), key=lambda i: (-file_sizes[i], i))
    for file_index in order:
        worker = min(range(num_workers), key=lambda w: (loads[w], w))
        assignment[worker].append(file_index)
        loads[worker] += file_sizes[file_index]
    return [sorted(files) for files in assignment]


def assign_items(num_items, num_workers):
    """Item indices per worker, `w, w + W, ...`: 7 items on 3 workers give `[[0, 3, 6], [1, 4], [2, 5]]`."""
    return [list(range(worker, num_items, num_workers)) for worker in range(num_workers)]


@dataclasses.dataclass(frozen=True)
class EpochSchedule:
    steps_per_epoch: int
    examples_per_worker: tuple
    padding_per_worker: tuple
    samples_dropped: int
    samples_padded: int


def schedule_epoch(worker_sizes, global_batch_size, last_batch):
    """The same steps for every worker from unequal shares `n_w`, as an `EpochSchedule`.

    Each worker yields `k` global batches of `G`, each lasting `W` steps, so an
    epoch is `k * W` steps: `"drop"` takes `k = min(n_w) // G`, `"pad"`
    `k = ceil(max(n_w) / G)` (zero-weight rows fill the rest), `"partial"` (one
    worker) `ceil(n / G)` steps. 1001 samples on 2 workers with `G = 32`:
    `"drop"` gives 30 steps, 41 dropped; `"pad"` 32 steps, 11 and 12 padded. ValueError when the
    data is empty, or `"drop"` leaves no full step.
    """
    num_workers, total = len(worker_sizes), sum(worker_sizes)
    if total == 0:
        raise ValueError("data is empty: there is nothing to train on.")
    if last_batch == "partial":
        check_last_batch(last_batch, num_workers=num_workers)
        return EpochSchedule(math.ceil(total / global_batch_size), (total,), (0,), 0, 0)
    if last_batch == "drop":
        batches_per_worker = min(worker_sizes) // global_batch_size
        if batches_per_worker == 0:
            where = f"the data has {total} samples"
            if num_workers > 1:
                where = f"the smallest of the {num_workers} workers' shares has {min(worker_sizes)}"
            raise ValueError(
                f"last_batch='drop' leaves no full step: {where}, fewer than one global batch of {global_batch_size}. Use a smaller batch size or last_batch='pad'."
            )
        examples = (batches_per_worker * global_batch_size,) * num_workers
        padding = (0,) * num_workers
    else:
        batches_per_worker = max(math.ceil(size / global_batch_size) for size in worker_sizes)
        examples = tuple(worker_sizes)
        padding = tuple(batches_per_worker * global_batch_size - size for size in worker_sizes)
    return EpochSchedule(
        batches_per_worker * num_workers, examples, padding, total - sum(examples), sum(padding)
    )


def small_batch_warning(per_replica_batch_size, device_kind):
    """A warning for fewer than 32 samples per GPU or TPU replica, else None."""
    if device_kind == "CPU" or per_replica_batch_size >= MIN_ACCELERATOR_PER_REPLICA_BATCH_SIZE:
        return None
    return f"per_replica_batch_size={per_replica_batch_size} is small for a {device_kind}: each device spends most of the step waiting. Use at least {MIN_ACCELERATOR_PER_REPLICA_BATCH_SIZE} per replica if memory allows."


@dataclasses.dataclass(frozen=True)
class InputPlan:
    """What `keras_scaling.data.distribute` feeds to each step, and why; `str(plan)` is a table.

    Args:
        num_examples: samples in the data, over all workers.
        num_replicas: replicas in sync across all workers.
        num_workers: workers (machines or processes).
        worker_index: this worker's index.
        per_replica_batch_size: samples per replica per step.
        global_batch_size: samples per step over all replicas (the dataset's batch).
        steps_per_epoch: steps in one epoch, the same on every worker.
        last_batch: `"drop"`, `"pad"` or `"partial"`.
        shard_mode: `"none"`, `"file"`, `"item"` (a `PyDataset`'s) or `"element"`.
        shard_reason: why that shard mode was chosen.
        samples_dropped_per_epoch: samples left out per epoch (`"drop"`).
        samples_padded_per_epoch: zero-weight rows added per epoch (`"pad"`).
        worker_examples: real samples this worker yields per epoch.
        shuffle: whether the order is shuffled every epoch.
        seed: the shuffle seed, the same on every worker.
        num_files: input files (or `PyDataset` items), or None.
        worker_files: files (or items) this worker reads, or None.
        device_kind: `"CPU"`, `"GPU"` or `"TPU"`.
        strategy: the strategy's class name.
        warnings: messages worth a user's attention (also logged).
        source_kind: what the data is, in words (`"arrays"`, ...).
        notes: how the batch size, the count and the shuffle were decided.
        file_unit: `"files"`, or `"items"` for a `PyDataset`.

    Example:

    ```python
    x = np.random.rand(1000, 8).astype("float32")
    plan = keras_scaling.data.describe((x, x), per_replica_batch_size=32)   # one device
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
        several = self.num_workers > 1
        replicas = f"{self.num_replicas} replica{'' if self.num_replicas == 1 else 's'}"
        files = "" if self.num_files is None else f" in {self.num_files} {self.file_unit}"
        own = "" if self.worker_files is None else f" from {self.worker_files} {self.file_unit}"
        rows = {
            "replicas": f"{self.num_replicas} on {self.num_workers} worker{'s' * several}"
            + f" (this is worker {self.worker_index})" * several,
            "batch": f"{self.per_replica_batch_size} per replica x {replicas} = {self.global_batch_size} global",
            "data": self.source_kind,
            "samples": f"{self.num_examples}{files}",
            "shard": f"{self.shard_mode} ({self.shard_reason})",
            "steps per epoch": self.steps_per_epoch,
            "last batch": f"{self.last_batch}: {self.samples_dropped_per_epoch} dropped, {self.samples_padded_per_epoch} padded per epoch",
            "shuffle": f"every epoch, seed {self.seed}" if self.shuffle else "no",
        }
        if several:
            rows["this worker"] = (
                f"{self.worker_examples} samples{own}, {self.per_worker_batch_size} per step"
            )
        lines = [f"Input plan ({self.strategy}, {self.device_kind}):"]
        lines += [f"  {name + ':':<17} {value}" for name, value in rows.items()]
        lines += [f"  note: {n}" for n in self.notes] + [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)
