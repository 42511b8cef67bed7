"""The bench's sweep plan: replica counts, batch sizes and CPU thread pools.

Pure arithmetic on numbers; nothing here touches TensorFlow.
"""

import dataclasses
import math
import os

from keras_scaling.cli._errors import UsageError


def parse_replica_counts(text):
    """Parses `--replicas`, such as `"1,2,4"`, into sorted distinct counts.

    Example: `parse_replica_counts("4,1,2")` is `(1, 2, 4)`.
    """
    return _parse_positive_list(text, "--replicas", "1,2,4")


def parse_batch_sizes(text):
    """Parses `--per-replica-batch`, such as `"16,32,64"`, into sorted distinct sizes.

    Example: `parse_batch_sizes("64")` is `(64,)`; `parse_batch_sizes("64,16")`
    is `(16, 64)`.
    """
    return _parse_positive_list(text, "--per-replica-batch", "16,32,64,128")


def _parse_positive_list(text, option, example):
    numbers = set()
    for part in text.split(","):
        part = part.strip()
        try:
            number = int(part)
        except ValueError:
            raise UsageError(
                f"{option} must be a comma-separated list of positive integers "
                f"such as {example}; got {text!r}"
            ) from None
        if number < 1:
            raise UsageError(f"{option} must hold positive integers, got {number} in {text!r}")
        numbers.add(number)
    return tuple(sorted(numbers))


def default_replica_counts(num_devices):
    """1, then the powers of two up to `num_devices`, then `num_devices` itself.

    Example: 8 devices give `(1, 2, 4, 8)`; 6 devices give `(1, 2, 4, 6)`.
    """
    counts = []
    count = 1
    while count <= num_devices:
        counts.append(count)
        count *= 2
    if counts[-1] != num_devices:
        counts.append(num_devices)
    return tuple(counts)


def check_replica_counts(replica_counts, num_devices, device_hint):
    """Raises `UsageError` when a count exceeds the devices there are."""
    too_many = [count for count in replica_counts if count > num_devices]
    if too_many:
        devices = "device" if num_devices == 1 else "devices"
        raise UsageError(
            f"--replicas asks for {max(too_many)} replicas but there "
            f"{'is' if num_devices == 1 else 'are'} {num_devices} {devices} "
            f"({device_hint}); ask for at most {num_devices}, or pass "
            f"--cpu-devices {max(too_many)} to sweep over logical CPUs"
        )


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One replica count of the sweep and its batch sizes.

    Args:
        replicas: replicas in sync.
        per_replica_batch_size: samples each replica takes per step.
        global_batch_size: samples per step over all replicas
            (`per_replica_batch_size * replicas`).
    """

    replicas: int
    per_replica_batch_size: int
    global_batch_size: int


def plan_batches(replica_counts, per_replica_batch_size=None, global_batch_size=None):
    """The batch sizes of every count: weak scaling, or strong scaling.

    Weak scaling (`per_replica_batch_size` given) keeps each replica's batch
    fixed, so the global batch grows with the replicas: 64 per replica gives
    global batches 64, 128, 256 on 1, 2, 4 replicas. Strong scaling
    (`global_batch_size` given) keeps the global batch fixed and splits it:
    256 gives 256, 128, 64 per replica; it must divide by every count.

    Returns:
        A list of `SweepPoint`, one per count.
    """
    if (per_replica_batch_size is None) == (global_batch_size is None):
        raise UsageError("give exactly one of --per-replica-batch and --global-batch")
    if per_replica_batch_size is not None:
        return [
            SweepPoint(count, per_replica_batch_size, per_replica_batch_size * count)
            for count in replica_counts
        ]
    not_dividing = [count for count in replica_counts if global_batch_size % count]
    if not_dividing:
        raise UsageError(
            f"--global-batch {global_batch_size} does not divide by "
            f"{not_dividing[0]} replicas; strong scaling splits the global batch "
            "evenly, so pass a multiple of every replica count (such as "
            f"{math.lcm(*replica_counts) * 32})"
        )
    return [
        SweepPoint(count, global_batch_size // count, global_batch_size) for count in replica_counts
    ]


def available_cores():
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class CpuThreads:
    """How the bench shares the CPU cores between logical CPU replicas.

    Logical CPU devices share the host's cores. To make N replicas stand for
    N devices, every replica gets a thread pool of its own with the same
    number of threads in every run of the sweep: `cores // largest count`.
    So the 1-replica baseline runs on that many cores and N replicas on N
    times as many, like adding devices; as long as the largest count is at
    most the number of cores, the speedup is real parallel speedup.

    Args:
        cores: CPU cores available to the process.
        threads_per_replica: intra-op threads of each replica's pool.
        largest_count: the largest replica count of the sweep.
    """

    cores: int
    threads_per_replica: int
    largest_count: int

    @property
    def oversubscribed(self):
        """Whether some count has more replicas than there are cores."""
        return self.largest_count > self.cores

    def intra_op_threads(self):
        """Intra-op threads of each replica's own pool."""
        return self.threads_per_replica

    def inter_op_threads(self, replicas):
        """Inter-op threads: one per replica, so replicas run side by side."""
        return replicas

    def describe(self):
        """One or two lines for the bench's output."""
        per = "thread" if self.threads_per_replica == 1 else "threads"
        text = (
            f"CPU thread pools: each replica has {self.threads_per_replica} intra-op "
            f"{per} of its own ({self.cores} cores // {self.largest_count}, the "
            "largest replica count), "
            f"so N replicas use N x {self.threads_per_replica} of the {self.cores} "
            "cores, like N devices."
        )
        if self.oversubscribed:
            text += (
                f"\nWARNING: {self.largest_count} replicas on {self.cores} cores: "
                "logical CPUs beyond the core count share cores, so the figures "
                f"above {self.cores} replicas are not meaningful as speedup."
            )
        return text


def plan_cpu_threads(replica_counts, cores):
    """The `CpuThreads` of a sweep over logical CPUs on `cores` cores."""
    largest = max(replica_counts)
    return CpuThreads(
        cores=cores,
        threads_per_replica=max(1, cores // largest),
        largest_count=largest,
    )
