"""keras_scaling.compat on 2 and 4 replicas of MirroredStrategy over logical CPUs.

The model is deterministic (fixed initial weights, SGD, no dropout, no
shuffling), so the same batches in the same order give the same weights
whatever `steps_per_execution` is: each step runs the same operations on the
same inputs, only the loop around the steps differs. The weights are compared
bitwise.
"""

import functools
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_scaling import compat, data

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers"))
import overflowing_model  # noqa: E402

REPLICAS = [
    pytest.param(2, marks=pytest.mark.logical_cpus(2), id="2replicas"),
    pytest.param(4, marks=pytest.mark.logical_cpus(4), id="4replicas"),
]
NUM_SAMPLES = 96
GLOBAL_BATCH_SIZE = 8
STEPS_PER_EPOCH = NUM_SAMPLES // GLOBAL_BATCH_SIZE  # 12
EPOCHS = 2
# 4 divides 12 steps per epoch; 5 does not: executions of 5, 5 and 2 steps.
STEPS_PER_EXECUTION = [1, 4, 5]

_strategies = {}
_runs = {}


def make_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_SAMPLES, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1)) + 0.1).astype("float32")
    return x, y


def mirrored_strategy(replicas):
    if replicas not in _strategies:
        devices = [device.name for device in tf.config.list_logical_devices("CPU")]
        assert len(devices) == replicas
        strategy = tf.distribute.MirroredStrategy(devices)
        compat.enable_for(strategy)
        _strategies[replicas] = strategy
    return _strategies[replicas]


def make_model(strategy, steps_per_execution):
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(
                    8, activation="relu", kernel_initializer=keras.initializers.Constant(0.1)
                ),
                keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(0.2)),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss="mse",
            metrics=["mae"],
            steps_per_execution=steps_per_execution,
        )
    return model


@functools.cache
def one_device_model():
    """A model on one device, outside any strategy, built once: its predict function is traced once."""
    return make_model(tf.distribute.get_strategy(), 1)


def train_evaluate_predict(replicas, steps_per_execution):
    """Runs fit, evaluate and predict once per (replicas, steps_per_execution)."""
    key = (replicas, steps_per_execution)
    if key not in _runs:
        strategy = mirrored_strategy(replicas)
        x, y = make_data()
        model = make_model(strategy, steps_per_execution)
        history = model.fit(
            x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=EPOCHS, shuffle=False, verbose=0
        )
        _runs[key] = {
            "history": history.history,
            "iterations": int(model.optimizer.iterations.numpy()),
            "weights": model.get_weights(),
            "evaluate": model.evaluate(
                x, y, batch_size=GLOBAL_BATCH_SIZE, verbose=0, return_dict=True
            ),
            "predict": model.predict(x, batch_size=GLOBAL_BATCH_SIZE, verbose=0),
        }
    return _runs[key]


@pytest.mark.parametrize("steps_per_execution", STEPS_PER_EXECUTION)
@pytest.mark.parametrize("replicas", REPLICAS)
def test_fit_makes_one_optimizer_step_per_batch(replicas, steps_per_execution):
    run = train_evaluate_predict(replicas, steps_per_execution)

    assert run["iterations"] == EPOCHS * STEPS_PER_EPOCH
    assert len(run["history"]["loss"]) == EPOCHS
    assert run["history"]["loss"][1] < run["history"]["loss"][0]


@pytest.mark.parametrize("steps_per_execution", [4, 5])
@pytest.mark.parametrize("replicas", REPLICAS)
def test_fused_steps_give_the_weights_of_single_steps(replicas, steps_per_execution):
    fused = train_evaluate_predict(replicas, steps_per_execution)
    single = train_evaluate_predict(replicas, 1)

    for fused_weight, single_weight in zip(fused["weights"], single["weights"]):
        np.testing.assert_array_equal(fused_weight, single_weight)
    assert fused["history"]["loss"] == single["history"]["loss"]


@pytest.mark.parametrize("steps_per_execution", [4, 5])
@pytest.mark.parametrize("replicas", REPLICAS)
def test_evaluate_counts_every_batch_including_the_partial_execution(replicas, steps_per_execution):
    fused = train_evaluate_predict(replicas, steps_per_execution)
    single = train_evaluate_predict(replicas, 1)

    # Dropping the last 2 batches of 12 would change the mean loss.
    assert fused["evaluate"] == single["evaluate"]


@pytest.mark.parametrize("steps_per_execution", STEPS_PER_EXECUTION)
@pytest.mark.parametrize("replicas", REPLICAS)
def test_predict_returns_one_row_per_sample_in_order(replicas, steps_per_execution):
    run = train_evaluate_predict(replicas, steps_per_execution)
    x, _ = make_data()
    # The same weights on one device, outside any strategy.
    reference = one_device_model()
    reference.set_weights(run["weights"])

    assert run["predict"].shape == (NUM_SAMPLES, 1)
    np.testing.assert_allclose(
        run["predict"], reference.predict(x, verbose=0), rtol=1e-6, atol=1e-6
    )


@pytest.mark.logical_cpus(2)
def test_fused_steps_stop_at_the_end_of_a_dataset_of_unknown_length():
    strategy = mirrored_strategy(2)
    x, y = make_data()
    # `filter` hides the length: the last execution finds 2 batches, and the
    # call after it finds none and ends the epoch.
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .batch(GLOBAL_BATCH_SIZE)
        .filter(lambda *batch: True)
    )
    model = make_model(strategy, 5)

    model.fit(dataset, epochs=EPOCHS, verbose=0)

    assert int(model.optimizer.iterations.numpy()) == EPOCHS * STEPS_PER_EPOCH


@pytest.mark.logical_cpus(2)
def test_one_worker_keeps_one_step_per_batch_of_a_dataset_tensorflow_does_not_shard():
    strategy = mirrored_strategy(2)
    x, y = make_data()
    # AutoShardPolicy.OFF, which the multi_worker_epoch fix looks for.
    train = data.distribute(
        (x, y), strategy=strategy, global_batch_size=GLOBAL_BATCH_SIZE, shuffle=False
    )
    model = make_model(strategy, 1)
    history = model.fit(train, epochs=EPOCHS, verbose=0)

    assert compat.status()["multi_worker_epoch"].active
    assert int(train.cardinality()) == data.plan_of(train).steps_per_epoch
    # The steps Keras expects, not only those the data allowed.
    assert history.params["steps"] == STEPS_PER_EPOCH
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * STEPS_PER_EPOCH


@pytest.mark.parametrize("replicas", REPLICAS)
def test_enable_for_with_model_fixes_the_fit_in_progress(replicas):
    strategy = mirrored_strategy(replicas)
    x, y = make_data()
    compat.disable()

    class EnableCompatOnTrainBegin(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            # Keras built `train_function` before this hook, without the fix.
            self.built_before = self.model.train_function
            compat.enable()
            compat.enable_for(strategy, model=self.model)

    callback = EnableCompatOnTrainBegin()
    model = make_model(strategy, 4)
    try:
        model.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=1, verbose=0, callbacks=[callback])
    finally:
        compat.enable()

    assert model.train_function is not callback.built_before
    assert int(model.optimizer.iterations.numpy()) == STEPS_PER_EPOCH


@pytest.mark.logical_cpus(2)
def test_keras_still_needs_the_steps_per_execution_fix():
    strategy = mirrored_strategy(2)
    x, y = make_data()
    model = make_model(strategy, 4)
    compat.disable("steps_per_execution")
    try:
        model.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=1, verbose=0)
    except tf.errors.InvalidArgumentError as error:
        assert "You must feed a value for placeholder tensor" in str(error)
    else:
        pytest.fail(
            f"keras-team/keras#19246 no longer reproduces with Keras "
            f"{keras.__version__}: fit with steps_per_execution=4 on 2 replicas "
            "works without keras_scaling's fix, so the steps_per_execution fix "
            "can be dropped"
        )
    finally:
        compat.enable()
    # The failed call leaves the strategy usable for the next fit.
    make_model(strategy, 4).fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=1, verbose=0)


def overflowing_on_the_second_replica():
    """The second replica's half of the first batch overflows."""
    return overflowing_model.data(NUM_SAMPLES, GLOBAL_BATCH_SIZE, GLOBAL_BATCH_SIZE // 2)


def replica_copies(model, strategy):
    return [
        [copy.numpy() for copy in strategy.experimental_local_results(variable.value)]
        for variable in model.variables
    ]


@pytest.mark.logical_cpus(2)
def test_a_step_that_overflows_on_the_second_replica_only_is_skipped():
    strategy = mirrored_strategy(2)
    model = overflowing_model.build(strategy)
    x, y = overflowing_on_the_second_replica()
    model.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=1, shuffle=False, verbose=0)

    # The first step updated nothing and halved the scale; the other 11 trained.
    assert int(model.optimizer.inner_optimizer.iterations.numpy()) == STEPS_PER_EPOCH - 1
    assert float(model.optimizer.dynamic_scale.numpy()) == 2.0**14
    for first, *others in replica_copies(model, strategy):
        assert np.isfinite(first).all()
        for other in others:
            np.testing.assert_array_equal(other, first)


@pytest.mark.logical_cpus(2)
def test_keras_still_needs_the_loss_scale_finite_fix():
    strategy = mirrored_strategy(2)
    x, y = overflowing_on_the_second_replica()
    compat.disable("loss_scale_finite")
    try:
        model = overflowing_model.build(strategy)
        model.fit(x[:GLOBAL_BATCH_SIZE], y[:GLOBAL_BATCH_SIZE], epochs=1, shuffle=False, verbose=0)
        if all(np.isfinite(weights).all() for weights in model.get_weights()):
            pytest.fail(
                f"Keras {keras.__version__} no longer applies a step whose gradients overflowed "
                "on the second replica only: the loss_scale_finite fix can be dropped"
            )
        assert int(model.optimizer.inner_optimizer.iterations.numpy()) == 1  # applied, not skipped
    finally:
        compat.enable()
