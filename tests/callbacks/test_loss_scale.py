"""BackupAndRestore under mixed precision, where Keras' `LossScaleOptimizer` skips updates.

A step whose float16 gradients overflow updates no weight and leaves
`optimizer.iterations` where it was (the loss scale halves instead): the
batches trained and the optimizer's steps part ways. On 2 logical CPUs, a
`mixed_float16` layer's gradients overflow at Keras' default loss scale
(2**15) for the first 3 steps; a run that crashes after step 10 of 16, with a
backup every 4 steps, resumes as if it had never stopped.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_scaling
from keras_scaling.preemption import _backup

pytestmark = pytest.mark.logical_cpus(2)

PER_REPLICA_BATCH = 8
STEPS_PER_EPOCH = 16
EPOCHS = 2


@pytest.fixture(scope="module")
def strategy():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def build(strategy):
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(32, activation="relu", dtype="mixed_float16"),
                keras.layers.Dense(1, dtype="float32"),
            ]
        )
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
        model.compile(optimizer=optimizer, loss="mse")
    return model


def data(strategy):
    rng = np.random.default_rng(0)
    num_examples = STEPS_PER_EPOCH * 2 * PER_REPLICA_BATCH
    x = rng.normal(size=(num_examples, 8)).astype("float32")
    y = 10 * x.sum(axis=1, keepdims=True)
    return keras_scaling.data.distribute(
        (x, y), strategy=strategy, per_replica_batch_size=PER_REPLICA_BATCH, seed=0
    )


class CrashAfter(keras.callbacks.Callback):
    def __init__(self, batches):
        super().__init__()
        self.batches = batches
        self.seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.batches:
            raise RuntimeError("the machine went away")


def state(model):
    return [v.numpy() for v in [*model.variables, *model.optimizer.variables]]


def test_a_resume_after_skipped_updates_continues_at_the_batch_it_stopped_at(strategy, tmp_path):
    never_stopped = build(strategy)
    never_stopped.fit(data(strategy), epochs=EPOCHS, verbose=0)
    updates = int(never_stopped.optimizer.inner_optimizer.iterations.numpy())
    # The scenario: some of the first epoch's steps updated nothing.
    assert 0 < updates < EPOCHS * STEPS_PER_EPOCH
    assert float(never_stopped.optimizer.dynamic_scale.numpy()) < 2.0**15
    assert all(np.isfinite(value).all() for value in state(never_stopped))

    backup_dir = str(tmp_path)
    crashed = build(strategy)
    with pytest.raises(RuntimeError, match="went away"):
        crashed.fit(
            data(strategy),
            epochs=EPOCHS,
            verbose=0,
            callbacks=[
                keras_scaling.BackupAndRestore(backup_dir, save_every_n_steps=4),
                CrashAfter(10),
            ],
        )
    header, _ = _backup.read(backup_dir)
    assert header["position"]["epoch"] == 0
    assert header["position"]["step_in_epoch"] == 8
    # The optimizer's own count, as the resume announces it: behind the batches.
    assert header["position"]["iterations"] < 8

    resumed = build(strategy)
    resumed.fit(
        data(strategy),
        epochs=EPOCHS,
        verbose=0,
        callbacks=[keras_scaling.BackupAndRestore(backup_dir)],
    )
    assert int(resumed.optimizer.inner_optimizer.iterations.numpy()) == updates
    for value, expected in zip(state(resumed), state(never_stopped), strict=True):
        np.testing.assert_array_equal(value, expected)
