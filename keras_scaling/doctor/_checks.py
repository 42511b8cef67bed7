"""The doctor's checks as plain functions of numbers, strings and dicts.

Nothing here touches TensorFlow: the collectives that gather the inputs live
in `_collectives.py`, so every verdict can be tested with made-up inputs.
"""

import dataclasses
import platform
import statistics

# Parameters of keras.applications.ResNet50() (weights=None, 1000 classes):
# its gradients are this many float32 values, 102.2 MB, all-reduced each step.
RESNET50_GRADIENT_FLOATS = 25_557_032
BYTES_PER_FLOAT32 = 4
BYTES_PER_MB = 1_000_000
RESNET50_GRADIENT_MB = RESNET50_GRADIENT_FLOATS * BYTES_PER_FLOAT32 / BYTES_PER_MB

# Below either, an all-reduce's time is mostly the fixed cost of starting a
# collective from Python (dispatch, the function call, one round trip), so
# size over time would not be a bandwidth.
MIN_TIMED_MB = 1.0
MIN_TIMED_S = 0.001

# The packages whose versions every worker must share, in the order printed.
VERSION_NAMES = {
    "python": "Python",
    "tensorflow": "TensorFlow",
    "keras": "Keras",
    "keras_scaling": "keras_scaling",
}


@dataclasses.dataclass(frozen=True)
class Check:
    """One verdict of `keras-scaling doctor`.

    Args:
        name: short name of the check, such as `"versions"`.
        ok: whether it passed; a note or a measurement always passes.
        message: what was found, and on a failure what to do about it.

    Example:

    ```python
    from keras_scaling.doctor import Check
    check = Check("all-reduce", ok=True, message="sum of 1..2 over 2 replicas is 3")
    print(check)   # ok    all-reduce: sum of 1..2 over 2 replicas is 3
    ```
    """

    name: str
    ok: bool
    message: str

    def __str__(self):
        return f"{'ok' if self.ok else 'FAIL':<5} {self.name}: {self.message}"


def local_versions(keras_scaling_version, tensorflow_version, keras_version):
    """{package: version} of this process, the keys of `VERSION_NAMES`."""
    return {
        "python": platform.python_version(),
        "tensorflow": tensorflow_version or "not installed",
        "keras": keras_version or "not installed",
        "keras_scaling": keras_scaling_version,
    }


def _worker_name(index, report):
    where = ", ".join(str(report[key]) for key in ("host", "address") if report.get(key))
    return f"worker {index} ({where})" if where else f"worker {index}"


def _missing_workers(reports, num_workers):
    answered = {report.get("worker", index) for index, report in enumerate(reports)}
    return sorted(set(range(num_workers)) - answered)


def compare_versions(reports, num_workers):
    """Whether every worker runs the same versions; names the workers that differ.

    Args:
        reports: one dict per worker that answered, in worker order, each
            holding its `"worker"` index, a `"versions"` dict (package ->
            version, keys of `VERSION_NAMES`) and optionally its `"host"`.
        num_workers: the workers of the job; a missing report fails the check.

    Returns:
        A `Check` named `"versions"`. On a mismatch its message names each
        package that differs and which worker runs which version; worker 0
        (the chief) is the reference when the versions split evenly.
    """
    if not reports:
        raise ValueError("reports must hold one dict per worker, got none")
    answered = [report.get("worker", index) for index, report in enumerate(reports)]
    missing = _missing_workers(reports, num_workers)
    if missing:
        return Check(
            "versions",
            ok=False,
            message=f"no report from worker(s) {_indices(missing)} of {num_workers}: they "
            "did not reach the doctor's checks, or cannot reach worker 0.",
        )
    differences = []
    for package, label in VERSION_NAMES.items():
        found = [report["versions"].get(package, "unknown") for report in reports]
        if len(set(found)) == 1:
            continue
        # The most common version is the one the job meant; ties go to worker 0's.
        counts = {version: found.count(version) for version in found}
        expected = max(counts, key=lambda version: (counts[version], version == found[0]))
        odd = [
            f"{_worker_name(answered[index], reports[index])} runs {version}"
            for index, version in enumerate(found)
            if version != expected
        ]
        holders = [answered[index] for index, version in enumerate(found) if version == expected]
        differences.append(
            f"{label} differs: {', '.join(odd)}; "
            f"{_plural(len(holders), 'worker')} ({_indices(holders)}) "
            f"{'runs' if len(holders) == 1 else 'run'} {expected}"
        )
    if differences:
        return Check(
            "versions",
            ok=False,
            message="; ".join(differences)
            + ". Install the same Python, TensorFlow, Keras and keras_scaling on every "
            "node (one image or one locked environment for the whole job).",
        )
    same = ", ".join(
        f"{label} {reports[0]['versions'].get(package, 'unknown')}"
        for package, label in VERSION_NAMES.items()
    )
    verb = "runs" if len(reports) == 1 else "run"
    return Check("versions", ok=True, message=f"{_plural(len(reports), 'worker')} {verb} {same}")


def _device_text(report):
    count = len(report["devices"])
    # The job and task prefix repeat the worker: "CPU:0" says the device.
    names = ", ".join(name.rsplit("device:", 1)[-1] for name in report["devices"])
    return f"{_plural(count, report['device_kind'] + ' replica')} ({names})"


def compare_devices(reports, num_workers):
    """Whether every worker has as many replicas as the others, on the same kind of device.

    `MultiWorkerMirroredStrategy` counts the replicas of the job as this
    worker's replicas times the workers, and every collective waits until
    that many replicas joined: workers that disagree on their devices wait
    forever in the first one. This check runs before any collective.

    Args:
        reports: one dict per worker that answered, in worker order, each
            holding its `"worker"` index, `"devices"` (the names of its
            replicas' devices), `"device_kind"` (`"CPU"`, `"GPU"` or
            `"TPU"`) and optionally its `"host"` and `"address"`.
        num_workers: the workers of the job; a missing report fails the check.

    Returns:
        A `Check` named `"devices"`. On a mismatch its message names every
        worker's replicas and devices.
    """
    if not reports:
        raise ValueError("reports must hold one dict per worker, got none")
    missing = _missing_workers(reports, num_workers)
    if missing:
        return Check(
            "devices",
            ok=False,
            message=f"unknown for worker(s) {_indices(missing)} of {num_workers}, which "
            "sent no report.",
        )
    shapes = {(len(report["devices"]), report["device_kind"]) for report in reports}
    if len(shapes) > 1:
        each = ", ".join(
            f"{_worker_name(report.get('worker', index), report)} has {_device_text(report)}"
            for index, report in enumerate(reports)
        )
        return Check(
            "devices",
            ok=False,
            message=f"the workers' devices differ: {each}. MultiWorkerMirroredStrategy "
            "needs the same number and kind of devices on every worker, or its collectives "
            "wait forever: give every worker the same --cpu-devices (KERAS_SCALING_CPU_DEVICES) "
            "or the same number of GPUs (CUDA_VISIBLE_DEVICES, srun --gpus-per-task).",
        )
    ((count, kind),) = shapes
    per_worker = _plural(count, f"{kind} replica")
    each = "" if len(reports) == 1 else " each"
    return Check(
        "devices",
        ok=True,
        message=f"{_plural(len(reports), 'worker')}, {per_worker}{each}: "
        f"{_plural(count * len(reports), 'replica')} in all",
    )


def _plural(count, noun):
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _indices(indices):
    return ", ".join(str(index) for index in indices)


def expected_all_reduce_sum(num_replicas):
    """The sum of the known values: replica r contributes r + 1, so 1 + ... + n."""
    return num_replicas * (num_replicas + 1) // 2


def check_all_reduce(reduced_values, num_replicas):
    """Whether an all-reduce (sum) of the known contributions gave the known result.

    Every element of replica r's tensor holds r + 1, so every element of the
    sum must be `expected_all_reduce_sum(num_replicas)`: a replica missing,
    counted twice or corrupted in transit changes it.

    Args:
        reduced_values: the summed tensor's values, as a flat sequence of numbers.
        num_replicas: the replicas in sync across all workers.

    Returns:
        A `Check` named `"all-reduce"`.
    """
    expected = expected_all_reduce_sum(num_replicas)
    values = list(reduced_values)
    if not values:
        return Check("all-reduce", ok=False, message="the all-reduce returned no values")
    wrong = [(index, value) for index, value in enumerate(values) if value != expected]
    if wrong:
        index, value = wrong[0]
        return Check(
            "all-reduce",
            ok=False,
            message=f"summing r + 1 over {num_replicas} replicas gave {value:g} at "
            f"element {index} ({len(wrong)} of {len(values)} elements wrong), expected "
            f"{expected}: the workers do not all take part in the collective, or its "
            "data is corrupted on the way. Check that every worker got the same "
            "cluster (TF_CONFIG) and the same devices.",
        )
    return Check(
        "all-reduce",
        ok=True,
        message=f"summing r + 1 over {_plural(num_replicas, 'replica')} gave {expected} "
        f"in all {len(values)} elements",
    )


def all_reduce_bandwidth_mb_per_s(size_bytes, seconds):
    """The all-reduce's algorithm bandwidth: bytes of one replica's tensor per second, in MB/s.

    The figure NCCL's tests call `algbw`: the tensor's size over the time the
    all-reduce took, whatever the algorithm moved on the wire. 1 MB is
    1,000,000 bytes.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return size_bytes / seconds / BYTES_PER_MB


def _size_text(size_bytes):
    if size_bytes < BYTES_PER_MB / 10:
        return f"{size_bytes:,} bytes"
    return f"{size_bytes / BYTES_PER_MB:.1f} MB"


def _durations_text(median_s, fastest_s, slowest_s):
    scale, unit = (1, "s") if slowest_s >= 0.01 else (1000, "ms")
    return (
        f"median {median_s * scale:.3f} {unit} over the rounds "
        f"({fastest_s * scale:.3f} to {slowest_s * scale:.3f} {unit})"
    )


def _rate_text(mb_per_s):
    return f"{mb_per_s:,.0f}" if mb_per_s >= 100 else f"{mb_per_s:.3g}"


def bandwidth_check(size_bytes, round_seconds, *, num_replicas=2):
    """A `Check` reporting the median all-reduce time and bandwidth of several rounds.

    No bandwidth is shown when there is none to measure: with one replica
    in all, the all-reduce combines nothing (`round_seconds` may then be
    empty); and a tensor under `MIN_TIMED_MB` or a median round under
    `MIN_TIMED_S` is too small to time, since the fixed cost of starting a
    collective, not the data, decides its time.

    Args:
        size_bytes: int, bytes of one replica's tensor.
        round_seconds: the seconds of each timed all-reduce.
        num_replicas: the replicas in sync across all workers.

    Returns:
        A `Check` named `"bandwidth"`: a measurement, which always passes.
    """
    if num_replicas == 1:
        return Check(
            "bandwidth",
            ok=True,
            message="one replica in all: an all-reduce has nothing to combine, so there is "
            "no bandwidth to measure",
        )
    if not round_seconds:
        raise ValueError("round_seconds must hold at least one timing, got none")
    ordered = sorted(round_seconds)
    median_s = statistics.median(ordered)
    text = (
        f"all-reduce of {_size_text(size_bytes)} of float32 over {num_replicas} replicas "
        f"(ResNet50's gradients are {RESNET50_GRADIENT_MB:.1f} MB): "
        + _durations_text(median_s, ordered[0], ordered[-1]).replace(
            "the rounds", f"{_plural(len(ordered), 'round')}"
        )
    )
    if size_bytes < MIN_TIMED_MB * BYTES_PER_MB or median_s < MIN_TIMED_S:
        return Check(
            "bandwidth",
            ok=True,
            message=f"{text}: too small to time a bandwidth (under {MIN_TIMED_MB:g} MB or "
            f"{MIN_TIMED_S * 1000:g} ms, the fixed cost of starting a collective decides the "
            "time, not the data); pass a larger size (--size-mb), such as "
            f"{RESNET50_GRADIENT_MB:.1f}",
        )
    return Check(
        "bandwidth",
        ok=True,
        message=f"{text}, {_rate_text(all_reduce_bandwidth_mb_per_s(size_bytes, median_s))} MB/s",
    )


def listening_addresses(proc_net_text, port):
    """The local addresses listening on TCP `port`, from the text of /proc/net/tcp or tcp6.

    Returns:
        list of str: `"0.0.0.0"` / `"::"` for every interface, else the
        address in its usual notation.
    """
    found = []
    for line in proc_net_text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != "0A":  # 0A: LISTEN
            continue
        address_hex, _, port_hex = fields[1].partition(":")
        if int(port_hex, 16) != port:
            continue
        found.append(_address_text(address_hex))
    return found


def _address_text(address_hex):
    # /proc/net/tcp* writes each 32-bit word of the address in host (little-endian) order.
    words = [bytes.fromhex(address_hex[i : i + 8])[::-1] for i in range(0, len(address_hex), 8)]
    raw = b"".join(words)
    if len(raw) == 4:
        return ".".join(str(byte) for byte in raw)
    if raw == bytes(16):
        return "::"
    if raw[:12] == bytes(10) + b"\xff\xff":
        return ".".join(str(byte) for byte in raw[12:])
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


def server_exposure_check(port, addresses, interfaces):
    """A note on who can reach this worker's TensorFlow server.

    Args:
        port: the worker's port from `TF_CONFIG`, or None when the job has no
            TensorFlow server (a single worker).
        addresses: the local addresses listening on `port`.
        interfaces: the names of this process's network interfaces.

    Returns:
        A `Check` named `"server"`: a note, which always passes.
    """
    guide = "see the Security section of the multi-worker guide (docs/guides/multi-worker.md)"
    if port is None:
        return Check("server", ok=True, message="one worker: no TensorFlow server is started")
    every = [address for address in addresses if address in ("0.0.0.0", "::")]
    where = (
        "on every network interface"
        if every
        else (f"on {', '.join(addresses)}" if addresses else "(not found listening)")
    )
    text = (
        f"this worker's TensorFlow gRPC server listens on port {port} {where}. It "
        "authenticates nobody: whoever reaches that port can run operations in this "
        "process and read its data."
    )
    others = sorted(name for name in interfaces if name != "lo")
    if not others:
        text += (
            " This process's network namespace has only loopback (as keras-scaling "
            "launch makes): nothing outside this machine can reach it."
        )
    else:
        text += (
            f" Interfaces besides loopback: {', '.join(others)}; keep the job on a "
            "private network or behind a firewall that admits only its workers."
        )
    return Check("server", ok=True, message=f"{text} ({guide})")
