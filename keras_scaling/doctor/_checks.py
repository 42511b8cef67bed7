"""The doctor's verdicts as functions of numbers, strings and dicts; no TensorFlow."""

import dataclasses
import ipaddress
import platform
import statistics

# Parameters of keras.applications.ResNet50() (1000 classes): float32 gradients each step.
RESNET50_GRADIENT_FLOATS = 25_557_032
BYTES_PER_FLOAT32 = 4
BYTES_PER_MB = 1_000_000
RESNET50_GRADIENT_MB = RESNET50_GRADIENT_FLOATS * BYTES_PER_FLOAT32 / BYTES_PER_MB

# Below either, the fixed cost of starting a collective decides the time, not the data.
MIN_TIMED_MB, MIN_TIMED_S = 1.0, 0.001

# The packages every worker must share, by the name printed.
VERSION_NAMES = {name.lower(): name for name in ("Python", "TensorFlow", "Keras", "keras_scaling")}


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
    found = (platform.python_version(), tensorflow_version, keras_version, keras_scaling_version)
    return {key: version or "not installed" for key, version in zip(VERSION_NAMES, found)}


def _worker_name(index, report):
    where = ", ".join(str(report[key]) for key in ("host", "address") if report.get(key))
    return f"worker {index} ({where})" if where else f"worker {index}"


def _missing(name, reports, num_workers, text):
    if not reports:
        raise ValueError("reports must hold one dict per worker, got none")
    answered = {report.get("worker", index) for index, report in enumerate(reports)}
    missing = sorted(set(range(num_workers)) - answered)
    return Check(name, False, text.format(_indices(missing), num_workers)) if missing else None


def compare_versions(reports, num_workers):
    """A `Check` "versions" of the reports (`"worker"`, `"versions"`, `"host"`, `"address"`) of the workers that answered."""
    text = "no report from worker(s) {} of {}: they did not reach the doctor's checks, or cannot reach worker 0."
    if missing := _missing("versions", reports, num_workers, text):
        return missing
    answered = [report.get("worker", index) for index, report in enumerate(reports)]
    differences = []
    for package, label in VERSION_NAMES.items():
        found = [report["versions"].get(package, "unknown") for report in reports]
        # The most common version is the one the job meant; ties go to worker 0's.
        counts = {version: found.count(version) for version in found}
        expected = max(counts, key=lambda version: (counts[version], version == found[0]))
        rows = list(zip(answered, reports, found))
        odd = [f"{_worker_name(w, report)} runs {v}" for w, report, v in rows if v != expected]
        holders = [worker for worker, _, version in rows if version == expected]
        if odd:
            who = f"{_plural(len(holders), 'worker')} ({_indices(holders)}) {_run(holders)}"
            differences.append(f"{label} differs: {', '.join(odd)}; {who} {expected}")
    if differences:
        fix = ". Install the same Python, TensorFlow, Keras and keras_scaling on every node."
        return Check("versions", False, "; ".join(differences) + fix)
    versions = reports[0]["versions"]
    same = ", ".join(
        f"{name} {versions.get(key, 'unknown')}" for key, name in VERSION_NAMES.items()
    )
    return Check("versions", True, f"{_plural(len(reports), 'worker')} {_run(reports)} {same}")


def _run(workers):
    return "runs" if len(workers) == 1 else "run"


def _device_text(report):
    # The job and task prefix repeat the worker: "CPU:0" says the device.
    names = ", ".join(name.rsplit("device:", 1)[-1] for name in report["devices"])
    return f"{_plural(len(report['devices']), report['device_kind'] + ' replica')} ({names})"


def compare_devices(reports, num_workers):
    """A `Check` "devices": whether every worker has as many replicas of the same kind (before any collective, which would wait forever)."""
    text = "unknown for worker(s) {} of {}, which sent no report."
    if missing := _missing("devices", reports, num_workers, text):
        return missing
    shapes = {(len(report["devices"]), report["device_kind"]) for report in reports}
    if len(shapes) > 1:
        each = ", ".join(
            f"{_worker_name(report.get('worker', index), report)} has {_device_text(report)}"
            for index, report in enumerate(reports)
        )
        fix = "MultiWorkerMirroredStrategy needs the same number and kind of devices on every worker: give every worker the same --cpu-devices or the same number of GPUs (CUDA_VISIBLE_DEVICES, srun --gpus-per-task)."
        return Check("devices", False, f"the workers' devices differ: {each}. {fix}")
    ((count, kind),) = shapes
    each = "" if len(reports) == 1 else " each"
    in_all = _plural(count * len(reports), "replica")
    message = f"{_plural(len(reports), 'worker')}, {_plural(count, f'{kind} replica')}{each}: {in_all} in all"
    return Check("devices", True, message)


def _plural(count, noun):
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _indices(indices):
    return ", ".join(str(index) for index in indices)


def expected_all_reduce_sum(num_replicas):
    """1 + ... + n: replica r contributes r + 1."""
    return num_replicas * (num_replicas + 1) // 2


def check_all_reduce(reduced_values, num_replicas):
    """A `Check` "all-reduce": whether every summed element is `expected_all_reduce_sum`."""
    expected = expected_all_reduce_sum(num_replicas)
    values = list(reduced_values)
    if not values:
        return Check("all-reduce", False, "the all-reduce returned no values")
    wrong = [(index, value) for index, value in enumerate(values) if value != expected]
    if wrong:
        index, value = wrong[0]
        message = f"summing r + 1 over {num_replicas} replicas gave {value:g} at element {index} ({len(wrong)} of {len(values)} elements wrong), expected {expected}: a worker is missing from the collective, or its data is corrupted. Check that every worker got the same cluster (TF_CONFIG) and devices."
        return Check("all-reduce", False, message)
    message = f"summing r + 1 over {_plural(num_replicas, 'replica')} gave {expected} in all {len(values)} elements"
    return Check("all-reduce", True, message)


def all_reduce_bandwidth_mb_per_s(size_bytes, seconds):
    """The tensor's size over the all-reduce's time in MB/s (NCCL's `algbw`)."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return size_bytes / seconds / BYTES_PER_MB


def bandwidth_check(size_bytes, round_seconds, *, num_replicas=2):
    """A passing `Check` "bandwidth": the median time and MB/s of the rounds (none with one replica, or under `MIN_TIMED_*`)."""
    if num_replicas == 1:
        text = "one replica in all: an all-reduce has nothing to combine, so there is no bandwidth to measure"
        return Check("bandwidth", True, text)
    if not round_seconds:
        raise ValueError("round_seconds must hold at least one timing, got none")
    median_s = statistics.median(round_seconds)
    fastest_s, slowest_s = min(round_seconds), max(round_seconds)
    scale, unit = (1, "s") if slowest_s >= 0.01 else (1000, "ms")
    size = f"{size_bytes / BYTES_PER_MB:.1f} MB"
    size = f"{size_bytes:,} bytes" if size_bytes < BYTES_PER_MB / 10 else size
    spread = f"{fastest_s * scale:.3f} to {slowest_s * scale:.3f} {unit}"
    text = f"all-reduce of {size} of float32 over {num_replicas} replicas (ResNet50's gradients are {RESNET50_GRADIENT_MB:.1f} MB): median {median_s * scale:.3f} {unit} over {_plural(len(round_seconds), 'round')} ({spread})"
    if size_bytes < MIN_TIMED_MB * BYTES_PER_MB or median_s < MIN_TIMED_S:
        text += f": too small to time a bandwidth (under {MIN_TIMED_MB:g} MB or {MIN_TIMED_S * 1000:g} ms, starting the collective decides the time); pass a larger size (--size-mb), such as {RESNET50_GRADIENT_MB:.1f}"
        return Check("bandwidth", True, text)
    rate = all_reduce_bandwidth_mb_per_s(size_bytes, median_s)
    rate_text = f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"
    return Check("bandwidth", True, f"{text}, {rate_text} MB/s")


def listening_addresses(proc_net_text, port):
    """The addresses listening on TCP `port` in /proc/net/tcp(6) text ("0.0.0.0", "::": all)."""
    found = []
    for line in proc_net_text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 4 and fields[3] == "0A":  # 0A: LISTEN
            address_hex, _, port_hex = fields[1].partition(":")
            if int(port_hex, 16) == port:
                # Each 32-bit word of the address is in host (little-endian) order.
                words = range(0, len(address_hex), 8)
                raw = b"".join(bytes.fromhex(address_hex[i : i + 8])[::-1] for i in words)
                address = ipaddress.ip_address(raw)
                found.append(str(getattr(address, "ipv4_mapped", None) or address))
    return found


def server_exposure_check(port, addresses, interfaces):
    """A passing `Check` "server": who can reach the server on `port` (None: no server)."""
    if port is None:
        return Check("server", True, "one worker: no TensorFlow server is started")
    where = f"on {', '.join(addresses)}" if addresses else "(not found listening)"
    if any(address in ("0.0.0.0", "::") for address in addresses):
        where = "on every network interface"
    others = sorted(name for name in interfaces if name != "lo")
    reach = f"Interfaces besides loopback: {', '.join(others)}; keep the job on a private network."
    if not others:
        reach = "This process's network namespace has only loopback: nothing outside reaches it."
    text = f"this worker's TensorFlow gRPC server listens on port {port} {where}. It authenticates nobody: whoever reaches that port can run operations in this process. {reach} (See the Security section of docs/guides/multi-worker.md.)"
    return Check("server", True, text)
