"""The TensorFlow side of `explain`: runs the variants of the training step and times them.

Every variant calls the model's own `train_function` in a Python loop, as `fit` does, without
callbacks; the one-replica copy runs under `OneDeviceStrategy`, which does not clash with the
process's `MirroredStrategy`.
"""

import contextlib
import math
import os
import statistics
import time

import numpy as np
import tensorflow as tf

from keras_scaling.devices import _topology

VARIANTS = ("real", "resident", "resident_amortized", "one_replica", "input_wait")


def _without_auto_shard(dataset):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def _resident_dataset(batch):
    return _without_auto_shard(tf.data.Dataset.from_tensors(batch).repeat())


class _Variant:
    """A train function and the iterator it draws from, at its steps per call."""

    def __init__(self, model, iterator, steps_per_execution):
        self.model, self.iterator, self.steps_per_execution = model, iterator, steps_per_execution
        model.steps_per_execution = steps_per_execution
        model.make_train_function(force=True)
        self.function = model.train_function

    def run(self, calls, iterator=None):
        """Seconds per step over `calls` calls, their last results read."""
        self.model.steps_per_execution = self.steps_per_execution
        start_s = time.perf_counter()
        for _ in range(calls):
            logs = self.function(self.iterator if iterator is None else iterator)
        for value in tf.nest.flatten(logs):
            np.asarray(value)
        return (time.perf_counter() - start_s) / (calls * self.steps_per_execution)


class _Pipeline(_Variant):
    """The user's pipeline (`self.iterator`, the distributed dataset), iterated afresh each round for `real` and `input_wait`."""

    fetch_overhead_s = 0.0

    def run_real(self, calls, steps):
        """`(seconds per step, seconds per step waited for the next batch)`: the mean eager fetch, less a ready batch's."""
        iterator = iter(self.iterator)
        self.run(calls, iterator)
        step_s = self.run(calls, iterator)
        # The first eager fetches after compiled ones are irregular (one waits a whole batch): untimed.
        untimed = max(5, steps // 5)
        waits_s = []
        for index in range(untimed + steps):
            start_s = time.perf_counter()
            batch = next(iterator)
            if index >= untimed:
                waits_s.append(time.perf_counter() - start_s)
            # Not an iterator: Keras' train function runs one step on it.
            logs = self.function([batch])
        for value in tf.nest.flatten(logs):
            np.asarray(value)
        return step_s, max(0.0, sum(waits_s) / steps - self.fetch_overhead_s)


def _fetch_s(iterator, fetches=10):
    times_s = []
    for _ in range(fetches):
        start_s = time.perf_counter()
        next(iterator)
        times_s.append(time.perf_counter() - start_s)
    return statistics.median(times_s)


@contextlib.contextmanager
def _state_restored(model):
    """Puts back the model's variables, optimizer state, `steps_per_execution`, train function and metrics."""
    from keras_scaling import _training_state

    values = _training_state.saved(model)
    steps_per_execution, train_function = model.steps_per_execution, model.train_function
    try:
        yield
    finally:
        _training_state.put_back(model, values)
        model.steps_per_execution, model.train_function = steps_per_execution, train_function
        model.reset_metrics()


def _built(model, strategy, batch):
    """Builds what `fit` builds before its first step, if a `fit` has not: the model, its loss and metrics, the optimizer.

    Built inside a train function that is not `fit`'s, their variables would
    be made in a branch of the traced step, which then fails ("You must feed
    a value for placeholder tensor"). One `test_on_batch` of `batch` builds
    them as `fit` does and changes no weight; `_state_restored` resets the
    metrics it updates.
    """
    import keras

    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or optimizer.built:
        return
    # A built model compiled without a loss (a GAN's own train_step computes its
    # losses, and it may have no call()) needs only the optimizer, as in fit.
    if not model.built or getattr(model, "loss", None) is not None:
        model.test_on_batch(*keras.utils.unpack_x_y_sample_weight(batch))
    if not optimizer.built:  # a model made outside any strategy's scope
        with strategy.scope():
            optimizer.build(model.trainable_variables)


def _one_replica_model(model, device, steps_per_execution, rows):
    """`(copy, strategy, None)`: `model` alone on `device`, compiled and built on `rows`; or `(None, _, reason)`."""
    from keras_scaling import _model_copy

    strategy = tf.distribute.OneDeviceStrategy(device)
    try:
        copy = _model_copy.copy_of(model, strategy.scope)
        _built(copy, strategy, rows)
        copy.steps_per_execution = steps_per_execution
    except Exception as error:  # a subclassed model without get_config, and the like
        return None, strategy, f"the model could not be copied to one device ({error})"
    return copy, strategy, None


def _pipeline_samples_per_sec(dataset, batches, global_batch_size):
    """The pipeline's own rate on this worker, pulled in a compiled loop (no Python cost)."""
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
    """Times the variants on `dataset` (this worker's global batches): the dict `_report` reads; `amortized` is K."""
    from keras_scaling import compat

    num_replicas = _topology.num_replicas(strategy)
    num_workers = _topology.num_workers(strategy)
    local_replicas = _topology.replicas_per_worker(strategy)
    devices = _topology._local_devices(strategy)
    device_kind = _topology._device_kind(devices)
    compat.enable_for(strategy)
    steps_per_execution = int(model.steps_per_execution or 1)
    # K: steps per call that make the host's per-call cost small against the step.
    amortized = amortized or max(16, 4 * steps_per_execution)
    dataset = _without_auto_shard(dataset.repeat())
    raw_batch = next(iter(dataset))
    _built(model, strategy, raw_batch)
    # keras-hub's tasks map `preprocess_samples` over the data in their `fit`,
    # not in their train function.
    preprocess = getattr(model, "preprocess_samples", None)
    if preprocess is not None and type(model).fit.__module__.startswith("keras_hub."):
        dataset = dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
        batch = next(iter(dataset))
    else:
        batch = raw_batch
    worker_batch_size = int(tf.nest.flatten(batch)[0].shape[0])
    if worker_batch_size % local_replicas:
        message = f"the data's batches hold {worker_batch_size} samples, which {local_replicas} replicas cannot share evenly; batch the data with keras_scaling.data.distribute(..., per_replica_batch_size=...)"
        raise ValueError(message)
    per_replica_batch_size = worker_batch_size // local_replicas
    global_batch_size = worker_batch_size * num_workers

    notes = []
    with _state_restored(model):
        distribute = strategy.experimental_distribute_dataset
        resident_iterator = iter(distribute(_resident_dataset(batch)))
        pipeline = _Pipeline(model, distribute(dataset), steps_per_execution)
        variants = {
            "resident": _Variant(model, resident_iterator, steps_per_execution),
            "resident_amortized": _Variant(model, resident_iterator, amortized),
        }
        if num_replicas > 1:
            raw_rows = tf.nest.map_structure(lambda x: x[:per_replica_batch_size], raw_batch)
            copy, one_strategy, reason = _one_replica_model(model, devices[0], amortized, raw_rows)
            if copy is None:
                notes.append(f"synchronization is not measured: {reason}")
            else:
                rows = tf.nest.map_structure(lambda x: x[:per_replica_batch_size], batch)
                one_dataset = one_strategy.experimental_distribute_dataset(_resident_dataset(rows))
                variants["one_replica"] = _Variant(copy, iter(one_dataset), amortized)
        calls = {
            name: max(2, math.ceil(steps / v.steps_per_execution)) for name, v in variants.items()
        }
        real_calls = max(2, math.ceil(steps / steps_per_execution))
        # Traces, and warms up the pipeline and the devices.
        pipeline.run_real(2, 2)
        for variant in variants.values():
            variant.run(2)
        pipeline.fetch_overhead_s = _fetch_s(resident_iterator)
        times: dict[str, list[float]] = {name: [] for name in ("real", "input_wait", *variants)}
        for _ in range(rounds):
            step_s, waited_s = pipeline.run_real(real_calls, steps)
            times["real"].append(step_s)
            times["input_wait"].append(waited_s)
            for name, variant in variants.items():
                times[name].append(variant.run(calls[name]))
        pipeline_samples_per_sec = num_workers * _pipeline_samples_per_sec(
            dataset, pipeline_batches or steps, worker_batch_size
        )
    if "one_replica" not in times:
        times["one_replica"] = times["resident_amortized"]
    return {
        "num_replicas": num_replicas,
        "num_workers": num_workers,
        "device_kind": device_kind,
        "host_cpu_replicas": device_kind == "CPU" and local_replicas > 1,
        "cpu_cores": (os.cpu_count() or 1) if device_kind == "CPU" else None,
        "compute_dtype": model.dtype_policy.compute_dtype,
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
    """`(mfu, reason)` of the compute part, one of them None."""
    from keras_scaling.mfu import flops
    from keras_scaling.mfu import peak_flops as peak_module

    if compute_s <= 0:
        return None, "the compute part measured 0 ms"
    flops_per_sample, reason = flops.count_training_flops(model)
    if flops_per_sample is None:
        return None, f"FLOPs not counted: {reason}"
    devices = _topology._local_devices(strategy)
    kind, dtype = _topology._device_kind(devices), model.dtype_policy.compute_dtype
    peak, reason = peak_module.resolve(
        peak_flops, device_kind=kind, device=devices[0], compute_dtype=dtype
    )
    if peak is None:
        return None, reason
    return flops_per_sample * per_replica_batch_size / compute_s / peak.flops_per_sec, None
