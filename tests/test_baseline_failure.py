"""`baseline="auto"` never competes with the run: it is timed before the first step, and a failure turns it off.

With several replicas `ThroughputLogger` times a copy of the model alone on
device 0 before the first step of `fit`. Here the copy really runs out of
memory: a layer asks for a terabyte when it runs outside a
`MirroredStrategy`, as the baseline's copy does (the run itself, on 2
logical CPUs, never asks). The allocator refuses and TensorFlow raises
`ResourceExhaustedError` inside the copy's training.
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


# The run's model, and the run's optimizer steps each step of the copy saw.
_run = {"model": None, "seen": []}


class RecordsTheRunsStepsOutsideMirrored(keras.layers.Layer):
    """Passes its input through; outside a MirroredStrategy it records the run's optimizer steps."""

    def call(self, inputs):
        if tf.distribute.has_strategy():
            return inputs

        def record():
            _run["seen"].append(int(_run["model"].optimizer.iterations.numpy()))
            return np.float32(0.0)

        return inputs + tf.reshape(tf.py_function(record, [], tf.float32), [])

    def compute_output_shape(self, input_shape):
        return input_shape


@pytest.mark.logical_cpus(2)
def test_the_baseline_copy_trains_before_the_runs_first_step_and_states_its_cost(
    strategy, tmp_path, caplog
):
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), RecordsTheRunsStepsOutsideMirrored(), keras.layers.Dense(1)]
        )
        model.compile(optimizer="sgd", loss="mse")
    _run.update(model=model, seen=[])
    logger = keras_scaling.ThroughputLogger(tmp_path, baseline="auto", update_freq=2)

    with caplog.at_level(logging.INFO, logger="keras_scaling"):
        model.fit(_data(), epochs=2, verbose=0, callbacks=[logger])

    # Every step of the copy ran while the run had taken no step.
    assert len(_run["seen"]) >= 10 and set(_run["seen"]) == {0}
    assert int(model.optimizer.iterations.numpy()) == 16
    (took,) = [
        r.getMessage() for r in caplog.records if "timing the baseline took" in r.getMessage()
    ]
    assert "before the first step" in took
    (text,) = [
        p.value
        for p in _tensorboard.read_summaries(_tensorboard.run_dir(tmp_path))[
            "throughput/setup_baseline"
        ]
    ]
    assert "| baseline took |" in text
    assert " s, timing a copy of the model alone before the first step" in text
    assert baseline.read_throughput_json(tmp_path)["baseline_samples_per_sec"] > 0
