"""`baseline="auto"` never costs the run: a failure of the copy it times is caught, the copy freed.

With several replicas `ThroughputLogger` times a copy of the model alone on
device 0 when `fit` starts. Here the copy really runs out of memory: a layer
asks for a terabyte when it runs outside a `MirroredStrategy`, as the
baseline's copy does (the run itself, on 2 logical CPUs, never asks). The
allocator refuses and TensorFlow raises `ResourceExhaustedError` inside the
copy's training. The room check's arithmetic is tested with numbers: a CPU
reports no memory, so it cannot run here.
"""

import gc
import logging
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_scaling
from keras_scaling.summaries import _tensorboard
from keras_scaling.throughput import baseline

# Every instance of the layer below, weakly: the run's and the copy's.
_instances = []


class NeedsATerabyteOutsideMirrored(keras.layers.Layer):
    """Passes its input through; outside a MirroredStrategy it first allocates a terabyte."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        _instances.append(weakref.ref(self))

    def call(self, inputs):
        if tf.distribute.has_strategy():
            return inputs
        # A size that depends on the data, known only when the step runs:
        # the graph optimizer cannot fold it away (the copy's batches are zeros).
        num_floats = tf.cast(tf.reduce_min(tf.abs(inputs)) >= 0.0, tf.int64) * 2**40
        return inputs + tf.reduce_sum(tf.fill(tf.reshape(num_floats, [1]), 1.0))


@pytest.fixture(scope="module")
def strategy():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _data():
    x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True)))
    return dataset.batch(32, drop_remainder=True)


@pytest.mark.logical_cpus(2)
def test_a_baseline_copy_out_of_memory_is_caught_freed_and_training_goes_on(
    strategy, tmp_path, caplog
):
    _instances.clear()
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), NeedsATerabyteOutsideMirrored(), keras.layers.Dense(1)]
        )
        model.compile(optimizer="adam", loss="mse")
    logger = keras_scaling.ThroughputLogger(tmp_path, baseline="auto", update_freq=2)

    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        history = model.fit(_data(), epochs=2, verbose=0, callbacks=[logger])

    assert int(model.optimizer.iterations.numpy()) == 16
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()
    (message,) = [
        r.getMessage() for r in caplog.records if "baseline='auto' failed" in r.getMessage()
    ]
    assert "training goes on without it" in message
    assert "ResourceExhaustedError: OOM when allocating tensor" in message
    assert "the copy is freed" in message
    (text,) = [
        p.value
        for p in _tensorboard.read_summaries(_tensorboard.run_dir(tmp_path))[
            "throughput/setup_baseline"
        ]
    ]
    assert "| measured against | none (no scaling/ tags) |" in text
    # The note is a paragraph below the table, its first letter capitalised.
    assert "Baseline='auto' failed" in text and "ResourceExhaustedError" in text
    record = baseline.read_throughput_json(tmp_path / baseline.THROUGHPUT_JSON)
    assert record["baseline_samples_per_sec"] is None
    assert record["samples_per_sec"] > 0
    gc.collect()
    alive = [ref() for ref in _instances if ref() is not None]
    # The run's layer only: the copy's layer, and so the copy, is gone.
    assert alive == [model.layers[0]]


def test_a_copy_that_fits_in_the_free_memory_with_a_tenth_to_spare_is_allowed():
    gib = 2**30
    assert baseline._room_for_copy(2 * gib, in_use_bytes=9 * gib, limit_bytes=16 * gib) is None


def test_a_copy_that_does_not_fit_says_how_much_it_needs_and_how_much_is_free():
    gib = 2**30
    reason = baseline._room_for_copy(
        6 * gib, in_use_bytes=9 * gib, limit_bytes=16 * gib, device="/device:GPU:0"
    )
    assert reason == (
        "a copy of the model needs about 6144 MiB (weights, gradients, optimizer state "
        "and one batch's activations) and /device:GPU:0 has 7168 MiB free of 16384 MiB"
    )


def test_the_copy_estimate_counts_weights_gradients_adam_slots_and_activations():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    weights = (8 * 4 + 4 + 4 * 2 + 2) * 4
    optimizer_state = sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.optimizer.variables
    )
    assert optimizer_state >= 2 * weights  # two Adam slots, and counters
    activations = 2 * (4 + 2) * 32 * 4

    estimate = baseline._copy_memory_bytes(model, batch_size=32)

    assert estimate == weights + weights + optimizer_state + activations


def test_a_cpu_reports_no_memory_so_the_baseline_is_measured_there():
    assert baseline._device_memory("/job:localhost/replica:0/task:0/device:CPU:0") is None
