"""The TensorFlow side of `explain`: runs the variants of the training step and times them.

Every variant runs the model's own Keras train function (`model.train_function`,
with the `keras_scaling.compat` fix for `steps_per_execution` > 1 on several
replicas) from a distributed iterator, called in a Python loop as `fit` calls
it, without callbacks. Variants differ only in where the batches come from,
how many steps one call runs and how many replicas run them:

- `real`: the user's pipeline, at the model's `steps_per_execution` S;
- `resident`: one batch of that pipeline, repeated from memory, at S;
- `resident_amortized`: the same at K > S steps per call;
- `one_replica`: a copy of the model on the first replica's device alone,
  under `OneDeviceStrategy` (no collective, so it does not clash with the
  `MirroredStrategy` of the process), on a per-replica slice of that batch, at K.

On the user's pipeline it also measures what the run waits for its next
batch, the time `IteratorGetNext` takes (what TensorFlow's data performance
guide reads in the profiler): `input_wait` runs the same train function
with each batch fetched eagerly, so the fetch can be timed, then trained on.

The variants take turns within each round, so a slow spell of the machine
spreads over all of them rather than landing on one; each counts the median
of its rounds. While the other variants run, the user's pipeline fills its
prefetch buffers, and a round that drained them would take batches faster
than the pipeline makes them: each round on the pipeline starts a fresh
iterator (empty buffers, as `fit` starts each epoch) and runs as many steps
untimed before timing. The model's weights, optimizer state, metrics and
`steps_per_execution` are put back afterwards.
"""

import logging
import math
import time

from keras_scaling.devices import _topology

logger = logging.getLogger("keras_scaling")

VARIANTS = ("real", "resident", "resident_amortized", "one_replica", "input_wait")


def default_amortized(steps_per_execution):
    """K: the steps per call that make the host's per-call cost small against the step."""
    return max(16, 4 * steps_per_execution)


def _cpu_count():
    import os

    return os.cpu_count() or 1


def _without_auto_shard(dataset):
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def _resident_dataset(batch):
    import tensorflow as tf

    return _without_auto_shard(tf.data.Dataset.from_tensors(batch).repeat())


def _wait_for(logs):
    import numpy as np
    import tensorflow as tf

    for value in tf.nest.flatten(logs):
        np.asarray(value)


class _Variant:
    """A train function and the iterator it draws from, at its steps per call."""

    def __init__(self, model, iterator, steps_per_execution):
        self.model = model
        self.iterator = iterator
        self.steps_per_execution = steps_per_execution
        model.steps_per_execution = steps_per_execution
        model.make_train_function(force=True)
        self.function = model.train_function

    def run(self, calls):
        """Runs `calls` calls; returns seconds per step."""
        self.model.steps_per_execution = self.steps_per_execution
        return _timed_calls(self.function, self.iterator, calls) / (
            calls * self.steps_per_execution
        )


def _timed_calls(function, iterator, calls):
    """Seconds `calls` calls of a train function take, its last results read."""
    start_s = time.perf_counter()
    logs = None
    for _ in range(calls):
        logs = function(iterator)
    _wait_for(logs)
    return time.perf_counter() - start_s


class _Pipeline:
    """The user's pipeline: the `real` step and the `input_wait`, a fresh iterator each round.

    A fresh iterator starts with empty prefetch buffers, so no round takes
    batches the pipeline buffered while the other variants ran; the untimed
    calls then bring it to its steady flow.
    """

    def __init__(self, model, distributed_dataset, steps_per_execution):
        self.model = model
        self.dataset = distributed_dataset
        self.steps_per_execution = steps_per_execution
        model.steps_per_execution = steps_per_execution
        model.make_train_function(force=True)
        self.function = model.train_function
        self.fetch_overhead_s = 0.0

    def run(self, calls, steps):
        """Returns `(seconds per step, seconds per step waited for the next batch)`.

        `calls` untimed calls, `calls` timed ones (the step), then steps
        whose batches are fetched eagerly, timed, and handed to the same
        train function: the wait is the mean fetch over `steps` of them (a
        rare long one, such as a pass's start, counts as in the step), less
        the fetch's own cost on a batch that is ready.
        """
        self.model.steps_per_execution = self.steps_per_execution
        iterator = iter(self.dataset)
        _timed_calls(self.function, iterator, calls)
        step_s = _timed_calls(self.function, iterator, calls) / (calls * self.steps_per_execution)
        # The first eager fetches after the compiled ones are irregular (one
        # waits a whole batch, the next few find theirs ready): untimed.
        untimed = max(5, steps // 5)
        waits_s, logs = [], None
        for index in range(untimed + steps):
            start_s = time.perf_counter()
            batch = next(iterator)
            if index >= untimed:
                waits_s.append(time.perf_counter() - start_s)
            # Not an iterator: Keras' train function runs one step on it.
            logs = self.function([batch])
        _wait_for(logs)
        del iterator
        return step_s, max(0.0, sum(waits_s) / steps - self.fetch_overhead_s)


def _fetch_s(iterator, fetches=10):
    """The median time of an eager fetch from an iterator whose batches are ready."""
    import statistics

    times_s = []
    for _ in range(fetches):
        start_s = time.perf_counter()
        next(iterator)
        times_s.append(time.perf_counter() - start_s)
    return statistics.median(times_s)


class _SavedState:
    """The model's variables and optimizer state, and what explain changes on it."""

    def __init__(self, model):
        self.model = model
        self.variables = [(v, v.numpy()) for v in model.variables]
        optimizer = getattr(model, "optimizer", None)
        self.optimizer_variables = (
            {id(v): v.numpy() for v in optimizer.variables} if optimizer else {}
        )
        self.steps_per_execution = model.steps_per_execution
        self.train_function = model.train_function

    def restore(self):
        import numpy as np

        for variable, value in self.variables:
            variable.assign(value)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            for variable in optimizer.variables:
                saved = self.optimizer_variables.get(id(variable))
                # Variables the first step created start as they were made: zeros.
                variable.assign(
                    saved if saved is not None else np.zeros(variable.shape, variable.dtype.name)
                )
        self.model.steps_per_execution = self.steps_per_execution
        self.model.train_function = self.train_function
        self.model.reset_metrics()


def _one_replica_model(model, device, steps_per_execution):
    """A copy of `model` on `device` alone, compiled as it is; or `(None, reason)`."""
    import tensorflow as tf

    strategy = tf.distribute.OneDeviceStrategy(device)
    try:
        # Read outside the new scope: mirrored variables refuse another strategy.
        weights = model.get_weights()
        architecture = model.get_config()
        config = model.get_compile_config()
        with strategy.scope():
            copy = type(model).from_config(architecture)
            copy.set_weights(weights)
            if config:
                copy.compile_from_config(config)
            else:
                copy.compile(optimizer=model.optimizer.__class__(), loss=model.loss)
            copy.steps_per_execution = steps_per_execution
    except Exception as error:  # a subclassed model without get_config, and the like
        return None, strategy, f"the model could not be copied to one device ({error})"
    return copy, strategy, None


def _first_rows(batch, rows):
    import tensorflow as tf

    return tf.nest.map_structure(lambda tensor: tensor[:rows], batch)


def _batch_size(batch):
    import tensorflow as tf

    return int(tf.nest.flatten(batch)[0].shape[0])


def _pipeline_samples_per_sec(dataset, batches, global_batch_size):
    """The pipeline's own rate on this worker, pulled in a compiled loop.

    A Python loop would add its own cost per batch to the pipeline's.
    """
    import tensorflow as tf

    iterator = iter(dataset)

    @tf.function
    def pull(count):
        for _ in tf.range(count):
            next(iterator)

    pull(tf.constant(2))
    start_s = time.perf_counter()
    pull(tf.constant(batches))
    return batches * global_batch_size / (time.perf_counter() - start_s)


def measure(model, dataset, strategy, *, steps, rounds, amortized=None, pipeline_batches=None):
    """Times the variants of the step; returns a dict of the figures, which `_report.explanation` reads.

    Args:
        model: a compiled Keras model built under `strategy`.
        dataset: a `tf.data.Dataset` of this worker's global batches.
        strategy: the `tf.distribute.Strategy`.
        steps: int, training steps each variant runs per round.
        rounds: int, rounds of all variants.
        amortized: int, K, or None for `default_amortized`.
        pipeline_batches: batches to time the pipeline alone over, or None
            for `steps`.
    """
    from keras_scaling import compat

    num_replicas = _topology.num_replicas(strategy)
    num_workers = _topology.num_workers(strategy)
    local_replicas = _topology.replicas_per_worker(strategy)
    devices = _topology._local_devices(strategy)
    device_kind = _topology._device_kind(devices)
    compat.enable_for(strategy)
    steps_per_execution = int(model.steps_per_execution or 1)
    amortized = amortized or default_amortized(steps_per_execution)
    dataset = _without_auto_shard(dataset.repeat())
    batch = next(iter(dataset))
    worker_batch_size = _batch_size(batch)
    if worker_batch_size % local_replicas:
        raise ValueError(
            f"the data's batches hold {worker_batch_size} samples, which "
            f"{local_replicas} replicas cannot share evenly; batch the data with "
            "keras_scaling.data.distribute(..., per_replica_batch_size=...)"
        )
    per_replica_batch_size = worker_batch_size // local_replicas
    global_batch_size = worker_batch_size * num_workers

    saved = _SavedState(model)
    notes = []
    try:
        resident_iterator = iter(strategy.experimental_distribute_dataset(_resident_dataset(batch)))
        pipeline = _Pipeline(
            model, strategy.experimental_distribute_dataset(dataset), steps_per_execution
        )
        variants = {
            "resident": _Variant(model, resident_iterator, steps_per_execution),
            "resident_amortized": _Variant(model, resident_iterator, amortized),
        }
        if num_replicas > 1:
            copy, one_strategy, reason = _one_replica_model(model, devices[0], amortized)
            if copy is None:
                notes.append(f"synchronization is not measured: {reason}")
            else:
                one_iterator = iter(
                    one_strategy.experimental_distribute_dataset(
                        _resident_dataset(_first_rows(batch, per_replica_batch_size))
                    )
                )
                variants["one_replica"] = _Variant(copy, one_iterator, amortized)
        calls = {
            name: max(2, math.ceil(steps / variant.steps_per_execution))
            for name, variant in variants.items()
        }
        real_calls = max(2, math.ceil(steps / steps_per_execution))
        # Traces, and warms up the pipeline and the devices.
        pipeline.run(2, 2)
        for variant in variants.values():
            variant.run(2)
        pipeline.fetch_overhead_s = _fetch_s(resident_iterator)
        times: dict[str, list[float]] = {name: [] for name in ("real", "input_wait", *variants)}
        for _ in range(rounds):
            step_s, waited_s = pipeline.run(real_calls, steps)
            times["real"].append(step_s)
            times["input_wait"].append(waited_s)
            for name, variant in variants.items():
                times[name].append(variant.run(calls[name]))
        pipeline_samples_per_sec = num_workers * _pipeline_samples_per_sec(
            dataset, pipeline_batches or steps, worker_batch_size
        )
    finally:
        saved.restore()
    if "one_replica" not in times:
        times["one_replica"] = times["resident_amortized"]
    return {
        "num_replicas": num_replicas,
        "num_workers": num_workers,
        "device_kind": device_kind,
        "host_cpu_replicas": device_kind == "CPU" and local_replicas > 1,
        "cpu_cores": _cpu_count() if device_kind == "CPU" else None,
        "per_replica_batch_size": per_replica_batch_size,
        "global_batch_size": global_batch_size,
        "steps_per_execution": steps_per_execution,
        "amortized_steps_per_execution": amortized,
        "steps": steps,
        "rounds": rounds,
        "variants": {name: times[name] for name in VARIANTS},
        "pipeline_samples_per_sec": pipeline_samples_per_sec,
        "notes": notes,
    }


def compute_mfu(model, strategy, peak_flops, per_replica_batch_size, compute_s):
    """MFU of the compute part: one replica's FLOPs over its compute time and peak.

    Returns `(mfu, reason)`, one of them None.
    """
    from keras_scaling.mfu import flops
    from keras_scaling.mfu import peak_flops as peak_module

    if compute_s <= 0:
        return None, "the compute part measured 0 ms"
    flops_per_sample, reason = flops.count_training_flops(model)
    if flops_per_sample is None:
        return None, f"FLOPs not counted: {reason}"
    devices = _topology._local_devices(strategy)
    peak, reason = peak_module.resolve(
        peak_flops,
        device_kind=_topology._device_kind(devices),
        device=devices[0],
        compute_dtype=model.dtype_policy.compute_dtype,
    )
    if peak is None:
        return None, reason
    return flops_per_sample * per_replica_batch_size / compute_s / peak.flops_per_sec, None
