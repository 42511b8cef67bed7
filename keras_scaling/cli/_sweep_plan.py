"""The bench's sweep plan: replica counts, batch sizes and CPU thread pools; no TensorFlow."""

import collections
import dataclasses
import math
import os

from keras_scaling.cli._errors import UsageError


def parse_replica_counts(text):
    """`--replicas`, such as `"4,1,2"`, as sorted distinct counts: `(1, 2, 4)`."""
    return _parse_positive_list(text, "--replicas", "1,2,4")


def parse_batch_sizes(text):
    """`--per-replica-batch`, such as `"64,16"`, as sorted distinct sizes: `(16, 64)`."""
    return _parse_positive_list(text, "--per-replica-batch", "16,32,64,128")


def _parse_positive_list(text, option, example):
    numbers = set()
    for part in text.split(","):
        try:
            number = int(part.strip())
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
    """1, the powers of two up to `num_devices`, and `num_devices`: 6 gives `(1, 2, 4, 6)`."""
    counts = [2**power for power in range(num_devices.bit_length())]
    return tuple(counts if counts[-1] == num_devices else [*counts, num_devices])


def check_replica_counts(replica_counts, num_devices, device_hint):
    """Raises `UsageError` when a count exceeds the devices there are."""
    most = max(replica_counts)
    if most > num_devices:
        are = "is 1 device" if num_devices == 1 else f"are {num_devices} devices"
        raise UsageError(
            f"--replicas asks for {most} replicas but there {are} ({device_hint}); ask for at "
            f"most {num_devices}, or pass --cpu-devices {most} to sweep over logical CPUs"
        )


SweepPoint = collections.namedtuple(
    "SweepPoint", "replicas per_replica_batch_size global_batch_size"
)


def plan_batches(replica_counts, per_replica_batch_size=None, global_batch_size=None):
    """A `SweepPoint` per count: weak scaling keeps `per_replica_batch_size`, strong `global_batch_size`.

    Raises:
        UsageError: a count does not divide the global batch.
    """
    if per_replica_batch_size is not None:
        return [
            SweepPoint(count, per_replica_batch_size, per_replica_batch_size * count)
            for count in replica_counts
        ]
    not_dividing = [count for count in replica_counts if global_batch_size % count]
    if not_dividing:
        raise UsageError(
            f"--global-batch {global_batch_size} does not divide by {not_dividing[0]} "
            "replicas; pass a multiple of every replica count (such as "
            f"{math.lcm(*replica_counts) * 32})"
        )
    return [
        SweepPoint(count, global_batch_size // count, global_batch_size) for count in replica_counts
    ]


def available_cores():
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class CpuThreads:
    """Each logical CPU replica's own pool of `cores // largest count` threads: N replicas use N times the cores of 1, like N devices."""

    cores: int
    threads_per_replica: int
    largest_count: int

    oversubscribed = property(lambda self: self.largest_count > self.cores)

    def intra_op_threads(self):
        return self.threads_per_replica

    def inter_op_threads(self, replicas):
        """One per replica, so replicas run side by side."""
        return replicas

    def describe(self):
        """One or two lines for the bench's output."""
        per = "thread" if self.threads_per_replica == 1 else "threads"
        text = (
            f"CPU thread pools: each replica has {self.threads_per_replica} intra-op {per} of "
            f"its own ({self.cores} cores // {self.largest_count}, the largest replica count), "
            f"so N replicas use N x {self.threads_per_replica} of the {self.cores} cores, "
            "like N devices."
        )
        if self.oversubscribed:
            text += (
                f"\nWARNING: {self.largest_count} replicas on {self.cores} cores: the figures "
                f"above {self.cores} replicas are not meaningful as speedup."
            )
        return text


def plan_cpu_threads(replica_counts, cores):
    """The `CpuThreads` of a sweep over logical CPUs on `cores` cores."""
    largest = max(replica_counts)
    return CpuThreads(cores, max(1, cores // largest), largest)
