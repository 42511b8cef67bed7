"""Throughput baselines, and the public names of the run record `throughput.json`.

A baseline is the throughput of one replica with the same per-replica batch;
speedup is measured against it. It comes from a number, from an earlier run's
`throughput.json`, or from timing a copy of the model on one device.

`log_dir/throughput.json` is written by `ThroughputLogger` and read by
baselines, `keras-scaling report` and `bench`; its keys are listed in
`FIELDS` and explained in the README. `read_throughput_json`,
`write_throughput_json` and `speedup_of` are the one reader, writer and
speedup of those records.
"""

import dataclasses
import gc
import logging
import numbers
import os
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from keras_scaling import _threads, _validation
from keras_scaling.internals import _probes
from keras_scaling.throughput._run_record import (
    FIELDS,
    THROUGHPUT_JSON,
    VERSION,
    measured_samples_per_sec,
    read_throughput_json,
    speedup_of,
    write_throughput_json,
)
from keras_scaling.throughput.arithmetic import ThroughputWindow
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


@dataclasses.dataclass(frozen=True)
class Baseline:
    """Where a run's baseline comes from, and its value once known.

    Args:
        mode: `"number"`, `"file"`, `"measure"` or `"auto"`; `"self"` once
            `"auto"` found one replica, which is its own baseline.
        samples_per_sec: float, or None until measured.
        source: str, where the figure comes from, as shown to the user.
        num_replicas: int, the replicas the baseline ran on (1 except for
            a file from a multi-replica run).
        record: the `throughput.json` record for `mode="file"`, else None.
        measure_time_s: float, the seconds timing the copy took (set-up,
            tracing and the timed steps) when this process measured it, else
            None.

    `resolve_baseline` makes one from a user's `baseline` argument; for
    `"measure"` and `"auto"` the figure is filled in later with `with_value`.

    Example:

    ```python
    from keras_scaling import baseline
    pending = baseline.resolve_baseline("measure")   # Baseline(mode="measure")
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
        """The `keras_scaling.throughput.Speedup` of a run's figure, or None while unknown.

        A `"self"` baseline is the run itself: speedup and ideal are 1.
        """
        if self.mode == "self":
            return _speedup(samples_per_sec, samples_per_sec, 1)
        if self.samples_per_sec is None:
            return None
        return _speedup(samples_per_sec, self.samples_per_sec, num_replicas, self.num_replicas)

    def record_fields(self, samples_per_sec: float | None) -> dict[str, Any]:
        """The `baseline_*` fields of a run record whose figure is `samples_per_sec`."""
        fields = dict(
            baseline_source=self.source,
            baseline_samples_per_sec=self.samples_per_sec,
            baseline_num_replicas=self.num_replicas,
        )
        if self.mode == "self" and samples_per_sec is not None:
            fields["baseline_samples_per_sec"] = samples_per_sec
        return fields


def resolve_baseline(
    baseline: float | str | os.PathLike[str] | None, parameter: str = "baseline"
) -> Baseline | None:
    """Checks a `baseline` argument and says where the figure will come from.

    Args:
        baseline: a positive number (samples/sec of one replica), a path to an
            earlier run's `log_dir` or `throughput.json`, `"measure"`,
            `"auto"`, or None (no baseline).
        parameter: the argument name to use in error messages.

    Returns:
        A `Baseline`, or None for `baseline=None`.

    Raises:
        ValueError: a number <= 0, or a path that does not exist or holds no
            throughput record.
        TypeError: any other type.

    Example:

    ```python
    from keras_scaling.baseline import resolve_baseline
    resolve_baseline(1500.0).samples_per_sec   # 1500.0
    resolve_baseline("measure").mode           # 'measure'
    # An earlier run's log_dir: its source is the absolute path of its
    # throughput.json, such as '/home/me/runs/one_gpu/throughput.json'.
    ```
    """
    if baseline is None:
        return None
    if isinstance(baseline, bool):
        raise TypeError(f"{parameter} must not be a bool, got {baseline!r}")
    if isinstance(baseline, numbers.Real):
        samples_per_sec = _validation.positive_number(
            baseline, parameter, unit="samples/sec of one replica"
        )
        return Baseline(mode="number", samples_per_sec=samples_per_sec, source="given")
    if isinstance(baseline, str) and baseline in ("measure", "auto"):
        return Baseline(mode=baseline)
    if isinstance(baseline, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(baseline))
        if os.path.isdir(path):
            path = os.path.join(path, THROUGHPUT_JSON)
        record = read_throughput_json(path, parameter=parameter)
        samples_per_sec = measured_samples_per_sec(
            record, f"{parameter}={path!r}", "train that run for more steps"
        )
        return Baseline(
            mode="file",
            samples_per_sec=samples_per_sec,
            source=path,
            num_replicas=int(record["num_replicas"]),
            record=record,
        )
    raise TypeError(
        f"{parameter} must be a positive number, a path, 'measure', 'auto' or "
        f"None, got {type(baseline).__name__}: {baseline!r}"
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

    A file's set-up is compared with the run's (a warning names each
    difference); `"auto"` with one replica becomes the run itself; `"auto"`
    with several and `"measure"` time a copy of `model` alone on `device`
    (where `measures`, the chief; elsewhere the figure stays unknown), once
    per model, batch spec and device in a process.

    Args:
        baseline: a `Baseline` from `resolve_baseline`, or None.
        setup: dict with `num_replicas`, `per_replica_batch_size`,
            `dtype_policy` and `device_kind`.
        model: the compiled Keras model being trained.
        one_replica_spec: one replica's batch spec, static shapes.
        device: str, the device to time the copy on.
        measures: bool, whether this process times the copy.
        shared_cores: bool, whether the replicas are logical CPUs that share
            the cores the copy has to itself.

    Returns:
        `(Baseline or None, note or None)`: the note says what the speedup
        means when it cannot be compared like with like (logged once here).

    Raises:
        ValueError: `"measure"` could not time the copy.

    Example:

    ```python
    from keras_scaling import baseline
    resolved, note = baseline.for_run(
        baseline.resolve_baseline("auto"),
        {"num_replicas": 1, "per_replica_batch_size": 32,
         "dtype_policy": "float32", "device_kind": "CPU"},
        model=None, one_replica_spec=None, device="/device:CPU:0",
    )
    resolved.mode   # 'self': one replica is its own baseline
    ```
    """
    from keras_scaling.throughput import _advice

    if baseline is None:
        return None, None
    if baseline.mode == "file":
        assert baseline.record is not None  # a file's baseline holds its record
        differences = setup_differences(
            baseline.record,
            per_replica_batch_size=setup["per_replica_batch_size"],
            dtype_policy=setup["dtype_policy"],
            device_kind=setup["device_kind"],
        )
        if baseline.num_replicas != 1:
            differences.append(f"the baseline ran on {baseline.num_replicas} replicas, not 1")
        if differences:
            logger.warning(
                "ThroughputLogger: the baseline %s was measured with another "
                "set-up, so speedup compares unlike runs: %s",
                baseline.source,
                "; ".join(differences),
            )
        return baseline, None
    if baseline.mode == "auto" and setup["num_replicas"] == 1:
        return Baseline(mode="self", source="this run (one replica is its own baseline)"), None
    if baseline.mode not in ("auto", "measure") or not measures:
        return baseline, None
    # Timed once per model, batch spec and device: a later fit of the same
    # model (a loop of fits, a notebook cell run again) reuses the figure.
    key = (repr(one_replica_spec), str(device), setup["dtype_policy"])
    measured = _MEASURED.setdefault(model, {})
    measure_time_s = None
    if key in measured:
        samples_per_sec = measured[key]
    else:
        if baseline.mode == "auto":
            no_room = _no_room_for_a_copy(model, one_replica_spec, device)
            if no_room is not None:
                note: str | None = (
                    f"baseline='auto' did not measure, to leave the run its memory: {no_room}"
                )
                logger.warning("ThroughputLogger: %s; no scaling/ tags", note)
                return None, note
        start_s = time.perf_counter()
        try:
            samples_per_sec = measure_samples_per_sec(model, one_replica_spec, device)
        except ValueError as error:
            if baseline.mode == "measure":
                raise
            note = f"baseline='auto' failed, training goes on without it: {error}"
            logger.warning("ThroughputLogger: %s; no scaling/ tags", note)
            return None, note
        measure_time_s = time.perf_counter() - start_s
        measured[key] = samples_per_sec
    note = None
    if shared_cores:
        note = _advice.shared_cores_baseline(setup["num_replicas"])
        logger.warning("ThroughputLogger: %s", note)
    resolved = baseline.with_value(
        samples_per_sec, f"measured: a copy of the model alone on {device}"
    )
    return dataclasses.replace(resolved, measure_time_s=measure_time_s), note


# What the room check leaves free of a device's memory for the run's own
# growth (fragmentation, a larger batch at the end of an epoch): a tenth.
_MEMORY_HEADROOM = 0.1


def _room_for_copy(needed_bytes, in_use_bytes, limit_bytes, *, device="the device"):
    """Why a copy of `needed_bytes` does not fit beside `in_use_bytes`, or None when it fits.

    The copy must fit in what is free of `limit_bytes` with a tenth of the
    device's memory left over.

    Args:
        needed_bytes: int, the estimate of the copy's memory.
        in_use_bytes: int, the device's memory in use now.
        limit_bytes: int, the device's memory TensorFlow may use.
        device: str, the device's name, for the reason.

    Returns:
        None when it fits, else a str saying how much is needed and free.
    """
    free_bytes = limit_bytes - in_use_bytes
    if needed_bytes <= free_bytes - _MEMORY_HEADROOM * limit_bytes:
        return None
    mib = 2**20
    return (
        f"a copy of the model needs about {needed_bytes / mib:.0f} MiB (weights, "
        f"gradients, optimizer state and one batch's activations) and {device} has "
        f"{free_bytes / mib:.0f} MiB free of {limit_bytes / mib:.0f} MiB"
    )


def _copy_memory_bytes(model, batch_size):
    """An estimate of the memory a training copy of `model` needs.

    Weights, their gradients, the optimizer's state and one batch's
    activations.

    Activations count every layer's output (with a known shape) twice, kept
    for the backward pass and its gradient.

    Args:
        model: a Keras model.
        batch_size: int, one replica's batch.

    Returns:
        int, bytes.
    """
    import numpy as np

    def size_bytes(variable):
        return int(np.prod(variable.shape)) * _dtype_size(variable.dtype)

    weights = sum(size_bytes(v) for v in model.weights)
    gradients = sum(size_bytes(v) for v in model.trainable_weights)
    optimizer = getattr(model, "optimizer", None)
    state = sum(size_bytes(v) for v in getattr(optimizer, "variables", ()) or ())
    if not getattr(optimizer, "built", False):
        state += 2 * gradients  # Adam's two slots, the most common optimizer's
    activations = 0
    for layer in getattr(model, "layers", ()):
        try:
            shape = tuple(layer.output.shape[1:])
            dtype = layer.output.dtype
        except (AttributeError, ValueError):
            continue  # a layer without a known output (subclassed models)
        if all(isinstance(d, int) for d in shape):
            activations += 2 * int(np.prod(shape)) * batch_size * _dtype_size(dtype)
    return weights + gradients + state + activations


def _dtype_size(dtype):
    import numpy as np

    name = getattr(dtype, "name", dtype)
    try:
        return np.dtype(str(name)).itemsize
    except TypeError:
        return 4  # bfloat16 and others NumPy does not know: at most 4 in practice


def _no_room_for_a_copy(model, one_replica_spec, device):
    """Why a copy of `model` would not fit on `device` now, or None.

    None too when the device reports no memory (a CPU).
    """
    memory = _device_memory(device)
    if memory is None:
        return None
    in_use_bytes, limit_bytes = memory
    import tensorflow as tf

    batch_size = tf.nest.flatten(one_replica_spec)[0].shape[0] or 1
    return _room_for_copy(
        _copy_memory_bytes(model, batch_size), in_use_bytes, limit_bytes, device=device
    )


def _device_memory(device):
    """`(in_use_bytes, limit_bytes)` of a device that reports its memory, else None.

    GPUs report the memory TensorFlow's allocator holds
    (`tf.config.experimental.get_memory_info`); the limit is the logical
    device's `memory_limit` when one was set, else the memory TensorFlow
    found on the device. A CPU reports none.

    Args:
        device: str, a device name such as `"/device:GPU:0"`.

    Returns:
        A tuple of two ints, or None.
    """
    import tensorflow as tf

    short_name = device.split("device:")[-1]
    if not short_name.upper().startswith("GPU"):
        return None
    try:
        in_use_bytes = int(tf.config.experimental.get_memory_info(short_name)["current"])
    except (ValueError, KeyError):
        return None
    limit_bytes = _memory_limit_bytes(short_name)
    if limit_bytes is None:
        return None
    return in_use_bytes, limit_bytes


def _memory_limit_bytes(short_name):
    import tensorflow as tf

    index = int(short_name.split(":")[-1])
    physical = tf.config.list_physical_devices("GPU")
    if index < len(physical):
        configured = tf.config.get_logical_device_configuration(physical[index]) or []
        if len(configured) == 1 and configured[0].memory_limit:
            return int(configured[0].memory_limit) * 2**20  # set in MiB
    return _device_lib_memory_limit(short_name)


@_probes.guarded(
    "tf.device_lib_memory_limit",
    reaches="tensorflow.python.client.device_lib.list_local_devices",
    lost=(
        "baseline='auto' cannot check that a copy of the model fits on a GPU whose "
        "memory limit was not set: it times the copy unchecked (a failure is still "
        "caught and training goes on)"
    ),
    workaround=(
        "Set the GPU's memory_limit with tf.config.set_logical_device_configuration, "
        "or pass baseline=<samples/sec of one replica>."
    ),
)
def _device_lib_memory_limit(short_name):
    """The reach: the memory limit TensorFlow's device list gives `short_name`, or None."""
    from tensorflow.python.client import device_lib

    for attributes in device_lib.list_local_devices():
        if attributes.name.endswith(short_name) and attributes.memory_limit:
            return int(attributes.memory_limit)
    return None


def setup_differences(
    record: Mapping[str, Any], *, per_replica_batch_size: int, dtype_policy: str, device_kind: str
) -> list[str]:
    """What differs between a baseline file's set-up and this run's.

    A baseline is only comparable when it ran with the same per-replica
    batch, dtype policy and kind of device.

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
    setup_differences({"per_replica_batch_size": 32, "dtype_policy": "float32",
                       "device_kind": "GPU"}, per_replica_batch_size=64,
                      dtype_policy="float32", device_kind="GPU")
    # ['per-replica batch 32 in the baseline, 64 here']
    ```
    """
    differences = []
    for label, key, value in (
        ("per-replica batch", "per_replica_batch_size", per_replica_batch_size),
        ("dtype policy", "dtype_policy", dtype_policy),
        ("device kind", "device_kind", device_kind),
    ):
        if record.get(key) != value:
            differences.append(f"{label} {record.get(key)} in the baseline, {value} here")
    return differences


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
    """Times a copy of `model` training alone on one device.

    The copy (`keras.models.clone_model` compiled with the model's compile
    config, including `steps_per_execution`) trains on synthetic batches of
    `element_spec`, one replica's batch, for `duration_s` seconds and at
    least `min_steps` steps after a first, untimed execution. The model's
    own weights and optimizer are not touched.

    It runs in a thread of its own, under TensorFlow's default strategy and
    `tf.device(device)`: the training strategy's scope and its collective
    all-reduce groups are thread-local and stay out of it (two
    `MirroredStrategy` instances of different sizes in one process break
    each other).

    Synthetic batches come from memory, so the figure is the step alone,
    without the input pipeline: efficiency below 1 then counts an input
    pipeline that cannot keep several replicas fed as a scaling loss.

    Args:
        model: a compiled Keras model.
        element_spec: one replica's batch, a structure of `tf.TensorSpec`
            with static shapes, `(x, y)` or `(x, y, sample_weight)`.
        device: str, the device to run on, such as `"/device:GPU:0"`.
        duration_s: float, seconds to time.
        min_steps, max_steps: int, bounds on the timed steps.
        clock: callable returning seconds.

    Returns:
        float, samples per second of the copy.

    Raises:
        ValueError: the model cannot be copied, the spec has unknown
            dimensions, or the copy's training failed (out of memory, for
            one): the message says why, and the copy is freed first.

    Example:

    ```python
    import keras
    import tensorflow as tf
    from keras_scaling import baseline
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    spec = (tf.TensorSpec([32, 8], tf.float32), tf.TensorSpec([32, 1], tf.float32))
    baseline.measure_samples_per_sec(model, spec, "/device:CPU:0", duration_s=0.5)
    ```
    """
    import keras
    import tensorflow as tf

    specs = tf.nest.flatten(element_spec)
    for spec in specs:
        if not isinstance(spec, tf.TensorSpec) or not spec.shape.is_fully_defined():
            raise ValueError(
                "baseline='measure' needs batches of static shape to time one "
                f"replica, got {spec}; pass baseline=<samples/sec of one replica> "
                "or the log_dir of a one-replica run"
            )
    batch_size = specs[0].shape[0]

    def synthetic(spec):
        if spec.dtype == tf.string:
            return tf.fill(spec.shape, "")
        return tf.zeros(spec.shape, spec.dtype)

    def train_copy():
        with tf.device(device):
            try:
                copy = keras.models.clone_model(model)
                copy.compile_from_config(model.get_compile_config())
            except Exception as error:
                raise ValueError(
                    "baseline='measure' could not copy the model with "
                    f"keras.models.clone_model ({type(error).__name__}: {error}); "
                    "pass baseline=<samples/sec of one replica> or the "
                    "log_dir of a one-replica run"
                ) from error
            batch = tf.nest.map_structure(synthetic, element_spec)
            dataset = tf.data.Dataset.from_tensors(batch).repeat()
            timer = _baseline_timer(duration_s, min_steps, clock)
            copy.fit(
                dataset,
                epochs=1,
                steps_per_epoch=max_steps + copy.steps_per_execution,
                verbose=0,
                shuffle=False,
                callbacks=[timer],
            )
            return timer.steps_per_sec() * batch_size

    def run():
        failure = None
        try:
            return train_copy()
        except ValueError:
            raise
        except Exception as error:  # out of memory, or anything else of the copy's training
            failure = f"{type(error).__name__}: {_first_line(error)}"
        # Raised outside the except clause: the error's traceback holds the
        # frames of the copy's fit, and so the copy; dropped, the copy is freed.
        gc.collect()
        raise ValueError(
            f"timing a copy of the model on {device} failed ({failure}); the copy "
            "is freed. Pass baseline=<samples/sec of one replica> or the log_dir of "
            "a one-replica run"
        )

    return _threads.run_outside_strategy(run, "baseline")


def _first_line(error):
    """The line of an error's message that says what went wrong.

    TensorFlow's errors in a compiled function start with "Graph execution
    error:" and the Python stack of the failing op; the allocator's own line
    ("OOM when allocating tensor ...") says what happened.
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "OOM" in line or "out of memory" in line.lower():
            return line
    return lines[0] if lines else type(error).__name__


def _baseline_timer(duration_s, min_steps, clock):
    """A callback that times the `fit` it is given to from the end of its first execution."""

    from keras_scaling.fit_hooks import _step_counter, _train_function_hook

    window = ThroughputWindow()
    state: dict[str, Any] = {
        "steps": 0,
        "start_time_s": None,
        "start_steps": None,
        "interval": None,
    }
    counter: dict[str, Any] = {"model": None, "reader": None}

    def batches_trained(model):
        if counter["model"] is not model:
            counter["model"], counter["reader"] = model, _step_counter.BatchCounter(model)
        return counter["reader"].read()

    # No batch hook: one would make Keras wait for every step to finish
    # before dispatching the next, as the timed training does not.
    def after_execution(model):
        state["steps"] += model.steps_per_execution
        if state["start_time_s"] is None:
            iterations = batches_trained(model)
            if iterations is None:
                # The probe of the step counter has said why: nothing is timed.
                state["counter_unknown"] = True
                model.stop_training = True
                return
            start_time_s = clock()
            state["start_time_s"], state["start_steps"] = start_time_s, state["steps"]
            window.restart(time_s=start_time_s, iterations=iterations, samples=0)
            return
        # The host clock alone decides when to stop; the counter read below
        # waits for the device, so the timed figure is exact.
        if (
            clock() - state["start_time_s"] < duration_s
            or state["steps"] - state["start_steps"] < min_steps
        ):
            return
        iterations = batches_trained(model)
        state["interval"] = window.update(time_s=clock(), iterations=iterations, samples=0)
        model.stop_training = True

    def steps_per_sec():
        if state.get("counter_unknown"):
            raise RuntimeError(
                "baseline='measure' cannot count the batches the copy of the model trained "
                "(gradient_accumulation_steps on this Keras: see the warning above)"
            )
        if state["interval"] is None:
            raise RuntimeError(
                "baseline='measure' ran out of steps before it could time the copy of the model"
            )
        return state["interval"].steps_per_sec

    timer = _train_function_hook.execution_callback(after_execution)
    timer.steps_per_sec = steps_per_sec
    return timer
