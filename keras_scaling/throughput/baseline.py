"""Throughput baselines (one replica, same per-replica batch), and the names of `throughput.json`."""

import dataclasses
import logging
import math
import numbers
import os
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from keras_scaling import _model_copy, _threads, _validation
from keras_scaling.throughput._run_record import (
    FIELDS,
    THROUGHPUT_JSON,
    VERSION,
    measured_samples_per_sec,
    read_throughput_json,
    speedup_of,
    write_throughput_json,
)
from keras_scaling.throughput.arithmetic import speedup as _speedup

if TYPE_CHECKING:
    import keras

    from keras_scaling.throughput import Speedup

logger = logging.getLogger("keras_scaling")

__all__ = [
    "Baseline",
    "FIELDS",
    "THROUGHPUT_JSON",
    "VERSION",
    "for_run",
    "measure_samples_per_sec",
    "read_throughput_json",
    "resolve_baseline",
    "setup_differences",
    "speedup_of",
    "write_throughput_json",
]

_FIX = "pass baseline=<samples/sec of one replica> or the log_dir of a one-replica run"


@dataclasses.dataclass(frozen=True)
class Baseline:
    """Where a run's baseline comes from, and its value once known.

    Args:
        mode: `"number"`, `"file"`, `"measure"`, `"auto"`, or `"self"`: one replica.
        samples_per_sec: float, or None until measured.
        source: str, where the figure comes from, as shown to the user.
        num_replicas: int, the replicas the baseline ran on.
        record: the `throughput.json` record for `mode="file"`, else None.
        measure_time_s: float, the seconds this process spent timing it.

    Example:

    ```python
    from keras_scaling import baseline
    pending = baseline.resolve_baseline("measure")
    known = pending.with_value(1500.0, "measured on /device:CPU:0")
    known.samples_per_sec   # 1500.0
    ```
    """

    mode: str
    samples_per_sec: float | None = None
    source: str | None = None
    num_replicas: int = 1
    record: dict | None = None
    measure_time_s: float | None = None

    def with_value(self, samples_per_sec: float, source: str) -> "Baseline":
        """A copy with the measured figure filled in."""
        return dataclasses.replace(self, samples_per_sec=samples_per_sec, source=source)

    def speedup(self, samples_per_sec: float, num_replicas: int) -> "Speedup | None":
        """The `Speedup` of a run's figure (1.0 for `"self"`), or None while unknown."""
        if self.mode == "self":
            return _speedup(samples_per_sec, samples_per_sec, 1)
        if self.samples_per_sec is None:
            return None
        return _speedup(samples_per_sec, self.samples_per_sec, num_replicas, self.num_replicas)

    def record_fields(self, samples_per_sec: float | None) -> dict[str, Any]:
        """The `baseline_*` fields of a run record whose figure is `samples_per_sec`."""
        own = self.mode == "self" and samples_per_sec is not None
        return dict(
            baseline_source=self.source,
            baseline_samples_per_sec=samples_per_sec if own else self.samples_per_sec,
            baseline_num_replicas=self.num_replicas,
        )


def resolve_baseline(
    baseline: float | str | os.PathLike[str] | None, parameter: str = "baseline"
) -> Baseline | None:
    """Checks a `baseline` argument and says where the figure will come from.

    Args:
        baseline: samples/sec of one replica, an earlier run's `log_dir` or
            `throughput.json`, `"measure"`, `"auto"`, or None (no baseline).
        parameter: the argument name to use in error messages.

    Returns:
        A `Baseline`, or None for `baseline=None`.

    Raises:
        ValueError: a number <= 0, or a path without a measured throughput record.
        TypeError: any other type.

    Example:

    ```python
    from keras_scaling.baseline import resolve_baseline
    resolve_baseline(1500.0).samples_per_sec   # 1500.0
    resolve_baseline("measure").mode           # 'measure'
    ```
    """
    if baseline is None:
        return None
    if isinstance(baseline, numbers.Real):  # a bool too: refused as not a number
        rate = _validation.positive_number(baseline, parameter, unit="samples/sec of one replica")
        return Baseline(mode="number", samples_per_sec=rate, source="given")
    if isinstance(baseline, str) and baseline in ("measure", "auto"):
        return Baseline(mode=baseline)
    if isinstance(baseline, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(baseline))
        if os.path.isdir(path):
            path = os.path.join(path, THROUGHPUT_JSON)
        record = read_throughput_json(path, parameter=parameter)
        where, remedy = f"{parameter}={path!r}", "train that run for more steps"
        samples_per_sec = measured_samples_per_sec(record, where, remedy)
        replicas = int(record["num_replicas"])
        return Baseline("file", samples_per_sec, path, num_replicas=replicas, record=record)
    raise TypeError(
        f"{parameter} must be a positive number, a path, 'measure', 'auto' or None, got {type(baseline).__name__}: {baseline!r}"
    )


# model -> {(one replica's batch spec, device, dtype policy): samples/sec}
_MEASURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def for_run(
    baseline: Baseline | None,
    setup: Mapping[str, Any],
    *,
    model: "keras.Model",
    one_replica_spec: Any,
    device: str,
    measures: bool = True,
    shared_cores: bool = False,
) -> tuple[Baseline | None, str | None]:
    """The baseline of a run once its set-up is known, and what its speedup means.

    A file of another set-up warns, naming each difference. `"auto"` with one
    replica is the run itself; `"auto"` with several and `"measure"` time a copy
    of `model` alone on `device` where `measures` (the chief), once per model,
    batch spec and device in a process; a failure of that timing (out of
    memory, say) warns once and leaves the run without a baseline.

    Args:
        baseline: a `Baseline` from `resolve_baseline`, or None.
        setup: dict with `num_replicas`, `per_replica_batch_size`, `dtype_policy`, `device_kind`.
        model, one_replica_spec, device: what `measure_samples_per_sec` times.
        measures: bool, whether this process times the copy.
        shared_cores: bool, whether the replicas are logical CPUs sharing the copy's cores.

    Returns:
        `(Baseline or None, note or None)`: the note, logged here, says why
        there is no baseline or what the speedup means.

    Example:

    ```python
    from keras_scaling import baseline
    setup = dict(num_replicas=1, per_replica_batch_size=32, dtype_policy="float32", device_kind="CPU")
    auto = baseline.resolve_baseline("auto")
    resolved, note = baseline.for_run(auto, setup, model=None, one_replica_spec=None, device="/device:CPU:0")
    resolved.mode   # 'self'
    ```
    """
    from keras_scaling.throughput import _advice

    if baseline is None:
        return None, None
    if baseline.mode == "file":
        assert baseline.record is not None  # a file's baseline holds its record
        keys = ("per_replica_batch_size", "dtype_policy", "device_kind")
        differences = setup_differences(baseline.record, **{key: setup[key] for key in keys})
        if baseline.num_replicas != 1:
            differences.append(f"the baseline ran on {baseline.num_replicas} replicas, not 1")
        if differences:
            logger.warning(
                f"ThroughputLogger: the baseline {baseline.source} was measured with another set-up, so speedup compares unlike runs: {'; '.join(differences)}"
            )
        return baseline, None
    if baseline.mode == "auto" and setup["num_replicas"] == 1:
        return Baseline(mode="self", source="this run (one replica is its own baseline)"), None
    if baseline.mode not in ("auto", "measure") or not measures:
        return baseline, None
    measured = _MEASURED.setdefault(model, {})
    key = (repr(one_replica_spec), str(device), setup["dtype_policy"])
    measure_time_s = None
    if key not in measured:
        start_s = time.perf_counter()
        try:
            measured[key] = measure_samples_per_sec(model, one_replica_spec, device)
        except ValueError as error:
            failure = f"baseline={baseline.mode!r} failed, training goes on without it: {error}"
            logger.warning("ThroughputLogger: %s; no scaling/ tags", failure)
            return None, failure
        measure_time_s = time.perf_counter() - start_s
        logger.info(
            f"ThroughputLogger: timing the baseline took {measure_time_s:.1f} s, before the first step"
        )
    note = _advice.shared_cores_baseline(setup["num_replicas"]) if shared_cores else None
    if note is not None:
        logger.warning("ThroughputLogger: %s", note)
    resolved = baseline.with_value(
        measured[key], f"measured: a copy of the model alone on {device}"
    )
    return dataclasses.replace(resolved, measure_time_s=measure_time_s), note


def setup_differences(
    record: Mapping[str, Any], *, per_replica_batch_size: int, dtype_policy: str, device_kind: str
) -> list[str]:
    """What differs between a baseline file's set-up and this run's.

    Args:
        record: dict, the baseline's `throughput.json` record.
        per_replica_batch_size: int, this run's per-replica batch size.
        dtype_policy: str, this run's dtype policy, such as `"float32"`.
        device_kind: str, this run's `"CPU"`, `"GPU"` or `"TPU"`.

    Returns:
        A list of readable differences, empty when the set-ups match.

    Example:

    ```python
    from keras_scaling.baseline import setup_differences
    run = {"per_replica_batch_size": 32, "dtype_policy": "float32", "device_kind": "GPU"}
    setup_differences(run, per_replica_batch_size=64, dtype_policy="float32", device_kind="GPU")
    # ['per-replica batch 32 in the baseline, 64 here']
    ```
    """
    return [
        f"{label} {record.get(key)} in the baseline, {value} here"
        for label, key, value in (
            ("per-replica batch", "per_replica_batch_size", per_replica_batch_size),
            ("dtype policy", "dtype_policy", dtype_policy),
            ("device kind", "device_kind", device_kind),
        )
        if record.get(key) != value
    ]


def measure_samples_per_sec(
    model: "keras.Model",
    element_spec: Any,
    device: str,
    *,
    duration_s: float = 1.0,
    min_steps: int = 10,
    max_steps: int = 10_000,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Times a copy of `model` training alone on one device, on synthetic batches.

    The copy (rebuilt from the model's config, or saved and loaded as a
    `.keras` file when a layer keeps assets such as a vocabulary) runs in a
    thread of its own, outside the training strategy; `model`'s weights and
    optimizer are not touched. How it is timed: the throughput guide's
    "Baselines".

    Args:
        model: a compiled Keras model.
        element_spec: one replica's batch, `tf.TensorSpec`s of static shape.
        device: str, the device to run on, such as `"/device:GPU:0"`.
        duration_s: float, seconds the timed `fit` lasts at least.
        min_steps, max_steps: int, bounds on the timed steps.
        clock: callable returning seconds.

    Returns:
        float, samples per second of the copy.

    Raises:
        ValueError: a dimension unknown, a model that cannot be copied, or
            the copy's training failed (out of memory, say).

    Example:

    ```python
    from keras_scaling import baseline
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    spec = (tf.TensorSpec([32, 8], tf.float32), tf.TensorSpec([32, 1], tf.float32))
    baseline.measure_samples_per_sec(model, spec, "/device:CPU:0", duration_s=0.5)
    ```
    """
    import tensorflow as tf

    specs = tf.nest.flatten(element_spec)
    for spec in specs:
        if not isinstance(spec, tf.TensorSpec) or not spec.shape.is_fully_defined():
            raise ValueError(
                f"baseline='measure' needs batches of static shape to time one replica, got {spec}; {_FIX}"
            )

    def train_copy():
        with tf.device(device):
            try:
                copy = _model_copy.copy_of(model, weights=False)
            except Exception as error:
                raise ValueError(
                    f"baseline='measure' could not copy the model ({type(error).__name__}: {error}); {_FIX}"
                ) from error
            batch = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), element_spec)
            dataset = tf.data.Dataset.from_tensors(batch).repeat()
            per_call = int(copy.steps_per_execution or 1)

            def fit_s(steps):
                start_s = clock()
                copy.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False)
                return clock() - start_s

            fit_s(2 * per_call)  # traces
            steps = per_call * math.ceil(min_steps / per_call)
            while (elapsed_s := fit_s(steps)) < duration_s and steps < max_steps:
                wanted = max(2 * steps, math.ceil(1.1 * steps * duration_s / max(elapsed_s, 1e-6)))
                steps = per_call * math.ceil(min(wanted, max_steps) / per_call)
            return steps * specs[0].shape[0] / elapsed_s

    def run():
        try:
            return train_copy()
        except ValueError:
            raise
        except Exception as error:  # out of memory, or anything else of the copy's training
            failure = f"{type(error).__name__}: {_first_line(error)}"
        # Raised outside the except clause, whose traceback holds the copy's frames.
        raise ValueError(
            f"timing a copy of the model on {device} failed ({failure}); the copy is freed. {_FIX}"
        )

    return _threads.run_outside_strategy(run, "baseline")


def _first_line(error):
    """The line of a TensorFlow error that says what went wrong (the allocator's, for an OOM)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    oom = [line for line in lines if "OOM" in line or "out of memory" in line.lower()]
    return (oom or lines or [type(error).__name__])[0]
