"""The callbacks, explain and tune on a keras.io-style GAN (`tests/workers/gan_model.py`).

Its own `train_step` steps the optimizers it holds, and `model.optimizer`
never steps. On 2 logical CPUs, from `keras_scaling.data.distribute`: a run
never stopped, and a run that crashes after step 10 of 16 with a backup at
step 8, resumed by a model built anew.
"""

import json
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers"))
from gan_model import (  # noqa: E402
    CRITIC_STEPS,
    EPOCHS,
    NUM_SAMPLES,
    PER_REPLICA_BATCH,
    STEPS_PER_EPOCH,
    CrashAfter,
    build_gan,
    gan_data,
    state,
)

import keras_scaling  # noqa: E402
from keras_scaling.preemption import _backup  # noqa: E402
from keras_scaling.replica_sync.replica_sync_check import ReplicaDivergenceError  # noqa: E402

pytestmark = pytest.mark.logical_cpus(2)


@pytest.fixture(scope="module")
def strategy():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


class GeneratorStepAtStart(keras.callbacks.Callback):
    """The generator optimizer's step when training starts, after the backup's restore."""

    def on_train_begin(self, logs=None):
        self.step = int(self.model.g_optimizer.iterations.numpy())


@pytest.fixture(scope="module")
def never_stopped(strategy, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("gan_logs")
    gan = build_gan(strategy)
    callbacks = [
        keras_scaling.ThroughputLogger(str(log_dir), baseline=None, warmup_steps=2),
        keras_scaling.BackupAndRestore(str(tmp_path_factory.mktemp("gan_backup"))),
    ]
    history = gan.fit(gan_data(strategy), epochs=EPOCHS, callbacks=callbacks, verbose=0)
    return gan, history, log_dir


def steps_measured_of_a_plain_model(strategy, directory):
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).random((NUM_SAMPLES, 8)).astype("float32")
    data = keras_scaling.data.distribute(
        (x, x[:, :1]), strategy=strategy, per_replica_batch_size=PER_REPLICA_BATCH
    )
    log_dir = directory / "plain_model"
    logger = keras_scaling.ThroughputLogger(str(log_dir), baseline=None, warmup_steps=2)
    model.fit(data, epochs=EPOCHS, callbacks=[logger], verbose=0)
    return json.loads((log_dir / "throughput.json").read_text())["steps_measured"]


def test_the_batches_of_a_model_stepping_its_own_optimizers_are_counted(strategy, never_stopped):
    gan, history, log_dir = never_stopped
    assert int(gan.optimizer.iterations.numpy()) == 0  # what counted the batches before
    assert int(gan.g_optimizer.iterations.numpy()) == EPOCHS * STEPS_PER_EPOCH
    assert int(gan.d_optimizer.iterations.numpy()) == CRITIC_STEPS * EPOCHS * STEPS_PER_EPOCH

    record = json.loads((log_dir / "throughput.json").read_text())
    # Measured as the steps of a model whose fit steps model.optimizer.
    assert record["steps_measured"] == steps_measured_of_a_plain_model(strategy, log_dir.parent)
    assert record["samples_per_sec"] == pytest.approx(
        record["steps_per_sec"] * 2 * PER_REPLICA_BATCH
    )
    assert all(epoch["steps_measured"] > 0 for epoch in record["epochs"])
    assert all(np.isfinite(history.history["samples_per_sec"]))
    # model(x) and a compiled loss are not what this step computes: no FLOPs, and why.
    assert record["flops_per_sample"] is None
    assert "own train_step" in record["flops_source"]
    assert "flops_per_sample=" in record["flops_source"]


def test_a_resume_restores_every_optimizer_and_the_step_it_stopped_at(
    strategy, never_stopped, tmp_path
):
    backup_dir = str(tmp_path / "backup")
    crashed = build_gan(strategy)
    with pytest.raises(RuntimeError, match="went away"):
        crashed.fit(
            gan_data(strategy),
            epochs=EPOCHS,
            callbacks=[
                keras_scaling.BackupAndRestore(backup_dir, save_every_n_steps=4),
                CrashAfter(10),
            ],
            verbose=0,
        )
    header, _ = _backup.read(backup_dir)
    assert header["position"]["step_in_epoch"] == 8

    resumed = build_gan(strategy)
    start = GeneratorStepAtStart()
    resumed.fit(
        gan_data(strategy),
        epochs=EPOCHS,
        callbacks=[keras_scaling.BackupAndRestore(backup_dir), start],
        verbose=0,
    )

    assert start.step == 8
    reference, _, _ = never_stopped
    for value, expected in zip(state(resumed), state(reference), strict=True):
        np.testing.assert_array_equal(value, expected)


def test_a_held_optimizer_not_built_at_resume_is_named_with_the_fix(strategy, tmp_path):
    backup_dir = str(tmp_path / "backup")
    gan = build_gan(strategy)
    gan.fit(
        gan_data(strategy).take(2),
        callbacks=[keras_scaling.BackupAndRestore(backup_dir, delete_checkpoint=False)],
        verbose=0,
    )
    unbuilt = build_gan(strategy)
    with strategy.scope():
        unbuilt.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3))

    with pytest.raises(ValueError, match=r"model\.d_optimizer: it is not built yet.*\.build\("):
        unbuilt.fit(
            gan_data(strategy),
            callbacks=[keras_scaling.BackupAndRestore(backup_dir)],
            verbose=0,
        )


def test_explain_of_a_gan_never_trained_leaves_every_optimizer_as_it_was(strategy):
    gan = build_gan(strategy)
    before = state(gan)

    result = keras_scaling.explain(gan, gan_data(strategy), steps=4, rounds=2, verbose=False)

    assert result.verdict.text
    for value, expected in zip(state(gan), before, strict=True):
        np.testing.assert_array_equal(value, expected)


def test_tune_puts_back_every_optimizer_the_model_holds(strategy):
    # What tune.tune does with the model between its rounds and at its end,
    # without a budget's timing: one round of real fit, then the restore.
    from keras_scaling.tune import _measure

    gan = build_gan(strategy)
    before = state(gan)
    runner = _measure.Runner(gan, strategy, gan_data(strategy))

    runner.round({"compile": {"steps_per_execution": 2}, "data": {}}, steps=4)
    assert int(gan.g_optimizer.iterations.numpy()) == _measure.EPOCHS * 4
    runner.restore()

    assert int(gan.g_optimizer.iterations.numpy()) == 0
    for value, expected in zip(state(gan), before, strict=True):
        np.testing.assert_array_equal(value, expected)


def test_replica_sync_check_compares_every_optimizer_the_model_holds(strategy):
    gan = build_gan(strategy)
    slot = gan.g_optimizer.variables[-1]  # a moment of the generator's last bias

    class ChangeReplica1(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                copy = strategy.experimental_local_results(slot.value)[1]
                copy.assign(copy.numpy() + 1.0)

    check = keras_scaling.ReplicaSyncCheck(every_n_steps=2)
    with pytest.raises(ReplicaDivergenceError, match=slot.path):
        gan.fit(gan_data(strategy).take(4), callbacks=[ChangeReplica1(), check], verbose=0)


def test_a_step_failing_on_optimizers_not_built_names_them_and_the_fix(strategy, tmp_path):
    gan = build_gan(strategy, build_optimizers=False)

    try:
        gan.fit(
            gan_data(strategy).take(2),
            callbacks=[keras_scaling.ThroughputLogger(str(tmp_path), baseline=None)],
            verbose=0,
        )
    except tf.errors.InvalidArgumentError as error:  # Keras 3.8 to 3.15
        (note,) = error.__notes__
        assert "model.d_optimizer and model.g_optimizer were not built before fit" in note
        assert "model.d_optimizer.build(" in note
    else:  # the nightly (3.16) builds them in the step: nothing to name
        assert int(gan.g_optimizer.iterations.numpy()) == 2
