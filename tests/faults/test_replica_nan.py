"""Fault: a NaN written into one replica's copy of a weight.

A real `MirroredStrategy` over 2 logical CPUs; the NaN is written straight
into replica 1's copy of a kernel (the distributed variable's
`.values[1].assign`), as a fault of that replica's memory or of code that
writes one copy only would leave it, between two `fit` calls. The next
`fit`'s first check (at its start, before any step) must name the replica,
its device and the variable, and count the NaN.
"""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_scaling

pytestmark = pytest.mark.logical_cpus(2)


@pytest.fixture(scope="module")
def strategy():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _trained_model(strategy):
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(3, name="hidden"), keras.layers.Dense(1)]
        )
        model.compile(optimizer="adam", loss="mse")
    model.fit(*_data(), batch_size=16, verbose=0)
    return model


def _data():
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def _write_nan_into_replica_1(model):
    kernel = model.get_layer("hidden").kernel
    copy = kernel.value.values[1]
    values = copy.numpy()
    values[2, 1] = np.nan
    copy.assign(values)
    return kernel


def test_a_nan_in_one_replicas_copy_stops_the_next_fit_naming_the_replica_and_variable(
    strategy,
):
    model = _trained_model(strategy)
    kernel = _write_nan_into_replica_1(model)
    weights_before = [copy.numpy() for copy in kernel.value.values]

    with pytest.raises(keras_scaling.ReplicaDivergenceError) as raised:
        model.fit(*_data(), batch_size=16, verbose=0, callbacks=[keras_scaling.ReplicaSyncCheck()])

    (diverged,) = raised.value.report.divergences
    assert diverged.path == kernel.path and kernel.path.endswith("/hidden/kernel")
    assert diverged.difference.differing_replicas == (1,)
    assert diverged.devices[0].endswith("/device:CPU:1")
    assert diverged.difference.nan_counts == (0, 1)
    message = str(raised.value)
    assert kernel.path in message
    assert "replicas differing from replica 0: 1 (" in message
    assert "replica 1: 1 NaN/0 Inf" in message
    # Stopped at the start, before a step could spread the NaN.
    assert raised.value.report.step == 4
    for before, copy in zip(weights_before, kernel.value.values):
        np.testing.assert_array_equal(copy.numpy(), before)


def test_resync_repairs_a_nan_in_one_replicas_copy_and_says_which(strategy, caplog):
    model = _trained_model(strategy)
    kernel = _write_nan_into_replica_1(model)
    check = keras_scaling.ReplicaSyncCheck(on_divergence="resync")

    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        history = model.fit(*_data(), batch_size=16, verbose=0, callbacks=[check])

    assert np.isfinite(history.history["loss"]).all()
    copies = [copy.numpy() for copy in kernel.value.values]
    np.testing.assert_array_equal(copies[0], copies[1])
    assert "resynced 1 variable(s) from replica 0" in caplog.text
    assert kernel.path in caplog.text
    assert "replica 1: 1 NaN/0 Inf" in caplog.text
