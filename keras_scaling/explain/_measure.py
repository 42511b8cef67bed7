"""The TensorFlow side of `explain`: runs the variants of the training step and times them.

Every variant calls the model's own `train_function` in a Python loop, as
`fit` does, without callbacks; variants differ in where batches come from
(the pipeline, or one batch resident in memory), the steps per call (S or
K) and the replicas (all, or a copy on the first device under
`OneDeviceStrategy`, which does not clash with the process's
`MirroredStrategy`). They take turns within each round, each counting its
median round.
"""

import math
import os
import statistics
import time

import numpy as np
import tensorflow as tf

from keras_scaling.devices import _topology

VARIANTS = ("real", "resident", "resident_amortized", "one_replica", "input_wait")


def default_amortized(steps_per_execution):
    """K: steps per call that make the host's per-call cost small against the step."""
    return max(16, 4 * steps_per_execution)


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
    """The user's pipeline (`self.iterator` is the distributed dataset): `real` and `input_wait`.

    A fresh iterator each round, so no round takes batches buffered while
    the other variants ran.
    """

    fetch_overhead_s = 0.0

    def run_real(self, calls, steps):
        """Returns `(seconds per step, seconds per step waited for the next batch)`.

        The wait: the mean eager fetch over `steps` steps, trained on by the
        same function, less a fetch's own cost on a ready batch.
        """
        iterator = iter(self.iterator)
        self.run(calls, iterator)
        step_s = self.run(calls, iterator)
        # The first eager fetches after the compiled ones are irregular (one
        # waits a whole batch, the next few find theirs ready): untimed.
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
        del iterator
        return step_s, max(0.0, sum(waits_s) / steps - self.fetch_overhead_s)


def _fetch_s(iterator, fetches=10):
    times_s = []
    for _ in range(fetches):
        start_s = time.perf_counter()
        next(iterator)
        times_s.append(time.perf_counter() - start_s)
    return statistics.median(times_s)


class _SavedState:
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
    """`(copy, strategy, None)`: `model` alone on `device`, compiled; or `(None, _, reason)`."""
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
    """Times the variants on `dataset` (this worker's global batches); the dict `_report` reads.

    `amortized` is K (None: `default_amortized`); `pipeline_batches` (None:
    `steps`) times the pipeline alone.
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
    worker_batch_size = int(tf.nest.flatten(batch)[0].shape[0])
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
                rows = tf.nest.map_structure(lambda x: x[:per_replica_batch_size], batch)
                one_dataset = one_strategy.experimental_distribute_dataset(_resident_dataset(rows))
                one_iterator = iter(one_dataset)
                variants["one_replica"] = _Variant(copy, one_iterator, amortized)
        calls = {
            name: max(2, math.ceil(steps / variant.steps_per_execution))
            for name, variant in variants.items()
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
    finally:
        saved.restore()
    if "one_replica" not in times:
        times["one_replica"] = times["resident_amortized"]
    return {
        "num_replicas": num_replicas,
        "num_workers": num_workers,
        "device_kind": device_kind,
        "host_cpu_replicas": device_kind == "CPU" and local_replicas > 1,
        "cpu_cores": (os.cpu_count() or 1) if device_kind == "CPU" else None,
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
    peak, reason = peak_module.resolve(
        peak_flops,
        device_kind=_topology._device_kind(devices),
        device=devices[0],
        compute_dtype=model.dtype_policy.compute_dtype,
    )
    if peak is None:
        return None, reason
    return flops_per_sample * per_replica_batch_size / compute_s / peak.flops_per_sec, None
