"""What `tune` tries, in which order, from explain's verdict and the settings.

Settings are four dicts of keyword arguments: `compile` (`model.compile`), `data`
(`keras_scaling.data.distribute`), `strategy` (`keras_scaling.auto_strategy`) and `cpu`
(`keras_scaling.use_logical_cpus`); a knob changes one entry of one of them.
"""

import dataclasses
import math
import os

# The knobs `allow` opens, by the name users pass.
ALLOWABLE = {"batch": "per_replica_batch_size", "precision": "mixed_precision"}

# Which knob first, by what explain found bounds the step: the remedy of the
# bound, then the rest by how often they pay off.
_ORDER = {
    "host": (
        "steps_per_execution",
        "bytes_per_pack",
        "communication",
        "cache",
        "jit_compile",
        "per_replica_batch_size",
    ),
    "input": (
        "cache",
        "private_threadpool_size",
        "steps_per_execution",
        "jit_compile",
        "per_replica_batch_size",
    ),
    "compute": ("jit_compile", "mixed_precision", "steps_per_execution", "cache"),
    "synchronization": (
        "per_replica_batch_size",
        "bytes_per_pack",
        "communication",
        "steps_per_execution",
        "cache",
        "jit_compile",
    ),
}
KNOBS = (
    "steps_per_execution",
    "bytes_per_pack",
    "communication",
    "cache",
    "jit_compile",
    "private_threadpool_size",
    "per_replica_batch_size",
    "mixed_precision",
)
# Settings of keras_scaling.data.distribute already at tf.data.AUTOTUNE: a
# row in the table says so rather than leaving them out.
AUTOTUNED = ("num_parallel_calls", "prefetch_batches")
# Where each knob lives in the settings.
SECTION = {
    "steps_per_execution": "compile",
    "jit_compile": "compile",
    "cache": "data",
    "private_threadpool_size": "data",
    "per_replica_batch_size": "data",
    "cross_device_ops": "strategy",
    "communication": "strategy",
    "bytes_per_pack": "strategy",
    "cpu_threads": "cpu",
}
# The all-reduce across workers: searched in the process itself, as
# `MultiWorkerMirroredStrategy` traces its options into each train function.
ACROSS_WORKERS = ("communication", "bytes_per_pack")
# Knobs after which the weights differ from the start's.
CHANGES_TRAINING = ("per_replica_batch_size", "mixed_precision")
# Knobs that keep the mathematics but not the float rounding: other
# kernels, sums split over another number of threads, or over 3 replicas
# and more, added in another order.
CHANGES_ROUNDING = ("jit_compile", "cpu_threads", "communication", "bytes_per_pack")
# Packs of a quarter of the gradients' bytes, a sixteenth, a sixty-fourth:
# the first two that split them otherwise than one pack and each other.
_PACK_DIVISORS = (4, 16, 64)
_MOST_PACK_SIZES = 2
# The largest steps_per_execution tried: beyond it the host's per-call cost
# is far below noise, and the epoch must hold whole calls.
LARGEST_STEPS_PER_EXECUTION = 64


def parse_allow(allow):
    """The knobs `allow` (names of `ALLOWABLE`, a sequence or a comma-separated string) opens; raises ValueError on an unknown one."""
    if isinstance(allow, str):
        allow = [name for name in allow.split(",") if name.strip()]
    names = []
    for name in allow or ():
        name = str(name).strip()
        if name not in ALLOWABLE:
            raise ValueError(
                f"allow: unknown knob {name!r}; the knobs that change training are "
                f"{', '.join(sorted(ALLOWABLE))} (the others are tried without asking)"
            )
        if ALLOWABLE[name] not in names:
            names.append(ALLOWABLE[name])
    return tuple(names)


def knob_order(bound, allowed=()):
    """The knobs to try for explain's `bound` (unknown: the host order), those changing training only when `allowed`."""
    order = list(_ORDER.get(bound, _ORDER["host"]))
    order += [knob for knob in KNOBS if knob not in order]
    return tuple(knob for knob in order if knob not in CHANGES_TRAINING or knob in tuple(allowed))


def ladder(current, first, largest):
    """Values each 4 times the last, from `first` (at least twice `current`), ending at `largest`: `ladder(1, 8, 64)` is `(8, 32, 64)`."""
    value = max(min(int(first), largest), 2 * int(current))
    values = []
    while value <= largest:
        values.append(value)
        value *= 4
    if values and values[-1] < largest:
        values.append(largest)
    return tuple(values)


@dataclasses.dataclass(frozen=True)
class Context:
    """What decides whether a knob applies.

    `pipeline_built` when tune builds the pipeline; `arrays` when the data are
    arrays, `shuffled` when their order changes every epoch, `array_bytes`
    their size and `free_bytes` the memory available (None: unknown);
    `cores` the machine's; `workers` those of the strategy,
    `communication_settable` when their all-reduce options can be set, and
    `gradient_sizes` the bytes of each gradient a step all-reduces.
    """

    device_kind: str
    local_replicas: int
    pipeline_built: bool
    arrays: bool = False
    shuffled: bool = True
    array_bytes: int = 0
    free_bytes: int | None = None
    cores: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    workers: int = 1
    communication_settable: bool = False
    gradient_sizes: tuple[int, ...] = ()


def reason_not_tried(knob, context):
    """Why `knob` is not tried in `context`, or None when it is."""
    if (
        knob in ("cache", "per_replica_batch_size", "private_threadpool_size")
        and not context.pipeline_built
    ):
        return (
            "the data came as global batches; pass the samples with "
            "per_replica_batch_size so tune builds the pipeline"
        )
    if knob == "cache" and context.arrays:
        if context.shuffled:
            return (
                "shuffled arrays are read from memory already, in other batches "
                "every epoch (a cache keeps the batches of arrays with shuffle=False)"
            )
        # The cache holds a second copy of the arrays; half the free memory at most.
        if context.free_bytes is not None and 2 * context.array_bytes > context.free_bytes:
            return (
                f"a copy of the arrays ({context.array_bytes / 2**30:.1f} GiB) would take "
                f"more than half the free memory ({context.free_bytes / 2**30:.1f} GiB)"
            )
    if knob in ACROSS_WORKERS:
        if not context.communication_settable:
            return (
                "this TensorFlow keeps the strategy's all-reduce options where tune cannot "
                "set them: compare runs of auto_strategy(communication=..., bytes_per_pack=...)"
            )
        if knob == "communication" and context.device_kind != "GPU":
            return f"between {context.device_kind}s the all-reduce is a ring; NCCL needs GPUs"
    if knob == "jit_compile" and context.workers > 1:
        return (
            "a worker whose XLA compile failed would leave the others waiting in the "
            "all-reduce: compare jit_compile=True by hand"
        )
    if knob == "jit_compile" and context.device_kind == "CPU" and context.local_replicas > 1:
        return "XLA cannot reach the other logical CPUs' variables"
    if knob == "mixed_precision":
        if context.device_kind == "CPU":
            return "mixed precision pays on GPUs and TPUs only"
        return (
            "the model must be built under "
            "keras.mixed_precision.set_global_policy('mixed_float16'): build it so "
            "and tune again to compare"
        )
    return None


def values_to_try(knob, settings, context=None, *, advised_steps_per_execution=None):
    """The values of `knob` to try in turn from the incumbent `settings` in `context` (a `Context`)."""
    current = settings[SECTION[knob]].get(knob)
    if knob == "steps_per_execution":
        current = int(current or 1)
        # Advice below 4 x the current value is too small a step to show
        # beyond this machine's noise.
        first = max(advised_steps_per_execution or 0, 4 * current)
        return ladder(current, first, LARGEST_STEPS_PER_EXECUTION)
    if knob == "per_replica_batch_size":
        return (2 * int(current), 4 * int(current))
    if knob in ("jit_compile", "cache"):
        return () if current else (True,)
    if knob == "private_threadpool_size":
        # A pool of the pipeline's own, one thread per core: the pipeline's
        # maps then do not wait behind the training step's ops.
        return () if current else ((context.cores if context else os.cpu_count()) or 1,)
    if knob == "communication":
        # What "auto" picks on GPUs.
        effective = current or "nccl"
        return tuple(name for name in ("nccl", "ring") if name != effective)
    if knob == "bytes_per_pack":
        if current:  # back to one pack of all the gradients
            return (0,)
        gradients = context.gradient_sizes if context else ()
        values, packings = [], {1}
        for divisor in _PACK_DIVISORS:
            size = math.ceil(sum(gradients) / divisor)
            packs = pack_count(gradients, size)
            if size > 0 and packs not in packings:
                values.append(size)
                packings.add(packs)
        return tuple(values[:_MOST_PACK_SIZES])
    raise ValueError(f"unknown knob {knob!r}")


def with_value(settings, knob, value):
    """A copy of `settings` with `knob` set to `value`."""
    section = SECTION[knob]
    changed = {name: dict(values) for name, values in settings.items()}
    if knob == "cpu_threads":  # the thread pools are the whole section
        changed[section] = dict(value)
    else:
        changed[section][knob] = value
    return changed


def pack_count(gradient_sizes, bytes_per_pack):
    """How many packs TensorFlow's all-reduce across workers makes of gradients of `gradient_sizes` bytes.

    As `cross_device_utils.group_by_size` groups them, last gradient first: a
    pack takes gradients until it holds more than `bytes_per_pack` (0: one pack).
    """
    if not bytes_per_pack or not gradient_sizes:
        return 1
    packs, last_pack_bytes = 0, 0
    for size in reversed(gradient_sizes):
        if not packs or last_pack_bytes > bytes_per_pack:
            packs, last_pack_bytes = packs + 1, 0
        last_pack_bytes += size
    return packs


def describe_change(knob, value, settings):
    """The change in words, with what the user must do when it changes training."""
    current = settings[SECTION[knob]].get(knob)
    if knob == "per_replica_batch_size":
        factor = value / current
        return (
            f"per_replica_batch_size {current} -> {value}: scale the learning rate by "
            f"{factor:g} (linear scaling rule) and check convergence"
        )
    if knob == "jit_compile":
        return "jit_compile=True: XLA's kernels, the same mathematics up to float rounding"
    if knob == "cpu_threads":
        return (
            f"CPU thread pools {describe_cpu_threads(value)}: the same mathematics, "
            "sums split over other threads may round differently"
        )
    if knob in ACROSS_WORKERS:
        return (
            f"{knob} {current or ('auto' if knob == 'communication' else 0)} -> {value}: the "
            "same mathematics; over 3 replicas or more the all-reduce may add in another "
            "order and round differently"
        )
    return f"{knob} {current} -> {value}"


# The all-reduce MirroredStrategy picks by itself: its collective all-reduce,
# over NCCL between physical GPUs and a ring between CPUs
# (tensorflow/python/distribute/mirrored_strategy.py,
# _make_collective_ops_with_fallbacks; tested against the installed one).
_DEFAULT_ALL_REDUCE = {
    "GPU": "the collective all-reduce (NCCL)",
    "CPU": "the collective all-reduce (ring)",
}
# On logical CPUs, reduction_to_one_device ran within the noise of
# hierarchical_copy (the bench's mlp): it is left out there, so that the
# budget goes to the thread pools.
_ALL_REDUCE = {
    "GPU": ("hierarchical_copy", "reduction_to_one_device"),
    "CPU": ("hierarchical_copy",),
}


def all_reduce_values(device_kind, local_replicas, num_workers):
    """`(cross_device_ops names to try against TensorFlow's choice, None)`, or `((), why none)`."""
    if num_workers > 1:
        return (), (
            "one machine's all-reduce; across workers the search tries communication "
            "and bytes_per_pack instead"
        )
    if local_replicas < 2:
        return (), "one replica: nothing to combine"
    if device_kind not in _ALL_REDUCE:
        return (), f"{device_kind} strategies choose their own all-reduce"
    return _ALL_REDUCE[device_kind], None


def default_all_reduce(device_kind):
    """The name of the all-reduce TensorFlow picks on `device_kind`, for the table."""
    return _DEFAULT_ALL_REDUCE.get(device_kind, "TensorFlow's choice")


def cpu_thread_values(cpu, cores):
    """`(cpu settings to try against the start's `cpu` on `cores` cores, None)`, or `((), why none)`."""
    count = cpu.get("n")
    if not count:
        return (), "the devices are not logical CPUs"
    values = [
        # TensorFlow's own: one intra-op pool of every core, shared by the devices.
        {"n": count},
        {"n": count, "threads_per_device": cores, "inter_op_threads": count},
    ]
    return tuple(value for value in values if value != cpu), None


def describe_cpu_threads(cpu):
    """`cpu` settings in words, for the table."""
    if not cpu.get("threads_per_device"):
        return "shared by the devices (TensorFlow's own)"
    inter = cpu.get("inter_op_threads")
    return f"of {cpu['threads_per_device']} thread(s) per device" + (
        f", {inter} inter-op" if inter else ""
    )
