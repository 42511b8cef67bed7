"""ReplicaSyncCheck on a real MirroredStrategy over 2 logical CPUs, with real fit.

Divergences are injected by assigning to one replica's copy of a variable
(`strategy.experimental_local_results(variable.value)[1].assign(...)`), or by
a layer that assigns to an aggregation-"none" weight in `call`.
"""

import gc
import logging
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_scaling.replica_sync import replica_state
from keras_scaling.replica_sync import replica_sync_check as replica_sync
from keras_scaling.replica_sync.replica_sync_check import ReplicaDivergenceError, ReplicaSyncCheck
from keras_scaling.summaries import _tensorboard

pytestmark = pytest.mark.logical_cpus(2)


@pytest.fixture(scope="module", params=["default all-reduce", "ReductionToOneDevice"])
def strategy(request):
    # Collective ops of two MirroredStrategy objects in one process number
    # their instances alike and clash ("Shape mismatch in the collective
    # instance 100"): this process holds one strategy with the default
    # (collective) all-reduce, and one that reduces to one device and so
    # runs no collective op.
    if request.param == "ReductionToOneDevice":
        return tf.distribute.MirroredStrategy(
            ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
        )
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _regression_data(num_samples=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_samples, 4)).astype("float32")
    return x, (x @ np.float32([[1], [2], [-1], [0.5]])).astype("float32")


def _mlp(strategy, optimizer="sgd", extra_layers=(), **compile_kwargs):
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(3), *extra_layers, keras.layers.Dense(1)]
        )
        model.compile(optimizer=optimizer, loss="mse", **compile_kwargs)
    return model


def _copies(strategy, variable):
    return [c.numpy() for c in strategy.experimental_local_results(variable.value)]


def _scalars(log_dir, tag):
    return _tensorboard.read_scalars(_tensorboard.run_dir(log_dir)).get(tag, [])


class AssignOnReplica1(keras.callbacks.Callback):
    """Changes replica 1's copy of a variable once, after a given optimizer step."""

    def __init__(self, strategy, get_variable, after_step, change):
        super().__init__()
        self.strategy, self.get_variable = strategy, get_variable
        self.after_step, self.change = after_step, change

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.after_step:
            copy = self.strategy.experimental_local_results(self.get_variable().value)[1]
            copy.assign(self.change(copy.numpy()))


class LastBatchMean(keras.layers.Layer):
    """Stores the mean of its training batch in an aggregation-"none" weight."""

    def build(self, input_shape):
        self.last_mean = self.add_weight(
            shape=(),
            initializer="zeros",
            trainable=False,
            aggregation="none",
            name="last_mean",
        )

    def call(self, inputs, training=False):
        if training:
            # In replica context this updates only the local copy
            # (tensorflow/tensorflow#37834): each replica saw another batch.
            self.last_mean.assign(keras.ops.mean(inputs))
        return inputs


# --- healthy runs -------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_healthy_training_reports_nothing_at_every_scheduled_step(strategy, optimizer, tmp_path):
    with strategy.scope():
        image = keras.Input((6, 6, 1))
        tokens = keras.Input((5,), dtype="int32")
        features = keras.layers.concatenate(
            [
                keras.layers.Flatten()(keras.layers.Conv2D(2, 3)(image)),
                keras.layers.Flatten()(keras.layers.Embedding(20, 3)(tokens)),
            ]
        )
        features = keras.layers.BatchNormalization(synchronized=True)(features)
        features = keras.layers.Dropout(0.3)(keras.layers.Dense(8, activation="relu")(features))
        model = keras.Model([image, tokens], keras.layers.Dense(1)(features))
        model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(0)
    images = rng.normal(size=(40, 6, 6, 1)).astype("float32")
    token_ids = rng.integers(0, 20, size=(40, 5)).astype("int32")
    y = rng.normal(size=(40, 1)).astype("float32")
    check = ReplicaSyncCheck(every_n_steps=2, log_dir=str(tmp_path))
    model.fit([images, token_ids], y, batch_size=8, epochs=1, callbacks=[check], verbose=0)
    assert check.last_report.ok and check.last_report.variables == ()
    assert check.last_report.num_variables == len(model.variables) + len(model.optimizer.variables)
    diverged = _scalars(str(tmp_path), "replica_sync/diverged_variables")
    # 5 steps: at the start, after steps 2 and 4, and at the end (step 5).
    assert [step for step, _ in diverged] == [0, 2, 4, 5]
    assert all(value == 0 for _, value in diverged)


def test_steps_per_execution_checks_when_iterations_cross_a_multiple(strategy, tmp_path):
    model = _mlp(strategy, optimizer="adam", steps_per_execution=4)
    x, y = _regression_data(32)
    check = ReplicaSyncCheck(every_n_steps=3, log_dir=str(tmp_path))
    # Batch hooks fire once per execution of 4 steps: iterations 4 and 8.
    model.fit(x, y, batch_size=4, epochs=1, callbacks=[check], verbose=0)
    model.fit(x, y, batch_size=4, epochs=1, callbacks=[check], verbose=0)
    assert check.last_report.ok and check.last_report.variables == ()
    steps = [step for step, _ in _scalars(str(tmp_path), "replica_sync/diverged_variables")]
    # The second fit's start check (step 8) repeats the first's end: written once.
    assert steps == [0, 4, 8, 12, 16]


def test_later_fits_reuse_the_traced_check_and_the_train_function(strategy):
    model = _mlp(strategy, optimizer="adam")
    x, y = _regression_data(32)
    check = ReplicaSyncCheck(every_n_steps=2)
    model.fit(x, y, batch_size=8, callbacks=[check], verbose=0)
    train_function = model.train_function
    fingerprint_function = check._checker._fingerprint_function
    model.fit(x, y, batch_size=8, callbacks=[check], verbose=0)
    model.fit(x, y, batch_size=8, verbose=0)
    # Nothing is traced or rebuilt anew: a later fit, with the callback or
    # without it, runs the functions the first one built.
    assert model.train_function is train_function
    assert check._checker._fingerprint_function is fingerprint_function
    assert fingerprint_function.experimental_get_tracing_count() == 1
    assert check.last_report.step == 8 and check.last_report.ok


def test_a_new_callback_on_the_same_model_reuses_its_traced_check_and_still_sees_changes(
    strategy,
):
    model = _mlp(strategy, optimizer="adam")
    x, y = _regression_data(32)
    first = ReplicaSyncCheck(every_n_steps=2)
    model.fit(x, y, batch_size=8, callbacks=[first], verbose=0)
    fingerprint_function = first._checker._fingerprint_function
    second = ReplicaSyncCheck(every_n_steps=3)
    model.fit(x, y, batch_size=8, callbacks=[second], verbose=0)
    assert second._checker is first._checker
    assert fingerprint_function.experimental_get_tracing_count() == 1
    assert second.last_report.step == 8 and second.last_report.ok
    # The shared function reads the copies as they are now.
    bias = model.layers[-1].bias
    strategy.experimental_local_results(bias.value)[1].assign([0.25])
    report = second.check()
    assert [v.path for v in report.divergences] == [bias.path]
    assert fingerprint_function.experimental_get_tracing_count() == 1


def test_other_settings_and_other_models_get_checkers_of_their_own(strategy):
    model = _mlp(strategy)
    x, y = _regression_data(32)
    bitwise = ReplicaSyncCheck()
    model.fit(x, y, batch_size=8, callbacks=[bitwise], verbose=0)
    tolerant = ReplicaSyncCheck(atol=1e-6)
    model.fit(x, y, batch_size=8, callbacks=[tolerant], verbose=0)
    assert tolerant._checker is not bitwise._checker
    assert (tolerant._checker.atol, bitwise._checker.atol) == (1e-6, 0.0)
    other_model = _mlp(strategy)
    other = ReplicaSyncCheck()
    other_model.fit(x, y, batch_size=8, callbacks=[other], verbose=0)
    assert other._checker is not bitwise._checker
    assert {id(v.variable) for v in other._checker.variables}.isdisjoint(
        id(v.variable) for v in bitwise._checker.variables
    )


def test_the_shared_checker_does_not_keep_its_model_alive(strategy):
    model = _mlp(strategy)
    x, y = _regression_data(32)
    model.fit(x, y, batch_size=8, callbacks=[ReplicaSyncCheck()], verbose=0)
    assert model in replica_sync._checkers_by_model
    model_reference = weakref.ref(model)
    del model
    gc.collect()
    assert model_reference() is None


# --- injected divergences are caught and named --------------------------------


def _adam_mlp(strategy):
    model = _mlp(strategy, optimizer="adam")
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    return model


def _checked(model):
    check = ReplicaSyncCheck()
    check.set_model(model)
    return check.check()


@pytest.mark.parametrize(
    "target, cause",
    [
        ("kernel", "gradients were not combined"),
        ("bias", "gradients were not combined"),
        ("optimizer slot", "optimizer state was updated with per-replica"),
        ("iteration counter", "optimizer steps were applied on some replicas"),
    ],
)
def test_a_changed_element_on_one_replica_is_named(strategy, target, cause):
    model = _adam_mlp(strategy)
    variable = {
        "kernel": model.layers[0].kernel,
        "bias": model.layers[1].bias,
        "optimizer slot": model.optimizer._momentums[0],
        "iteration counter": model.optimizer.iterations,
    }[target]
    copy = strategy.experimental_local_results(variable.value)[1]
    value = np.array(copy.numpy())
    value.reshape(-1)[0] += 1
    copy.assign(value)
    report = _checked(model)
    (diverged,) = report.divergences
    assert diverged.path == variable.path
    assert diverged.difference.differing_replicas == (1,)
    assert diverged.devices[0].endswith("CPU:1")
    assert diverged.difference.num_differing_elements == 1
    assert diverged.difference.max_abs_diff == pytest.approx(1.0)
    assert cause in diverged.likely_cause
    assert variable.path in str(report) and f"step {report.step}" in str(report)


def test_a_one_ulp_change_of_one_element_is_caught(strategy):
    model = _adam_mlp(strategy)
    kernel = model.layers[0].kernel
    copy = strategy.experimental_local_results(kernel.value)[1]
    value = copy.numpy()
    before = value[2, 1]
    value[2, 1] = np.nextafter(before, np.float32(np.inf))
    copy.assign(value)
    (diverged,) = _checked(model).divergences
    assert diverged.path == kernel.path
    assert diverged.difference.num_differing_elements == 1
    assert diverged.difference.max_abs_diff == pytest.approx(
        abs(float(value[2, 1]) - float(before))
    )


def test_a_nan_on_one_replica_is_counted_and_blamed_on_that_replica(strategy):
    model = _adam_mlp(strategy)
    bias = model.layers[0].bias
    copy = strategy.experimental_local_results(bias.value)[1]
    copy.assign([np.nan, 0.0, 0.0])
    (diverged,) = _checked(model).divergences
    assert diverged.path == bias.path
    assert diverged.difference.nan_counts == (0, 1)
    assert diverged.likely_cause.startswith("NaN/Inf on replica(s) 1 only")


def test_raise_stops_fit_at_the_first_check_after_the_divergence(strategy):
    model = _mlp(strategy)
    x, y = _regression_data(64)
    inject = AssignOnReplica1(strategy, lambda: model.layers[1].kernel, 3, lambda v: v + 0.5)
    check = ReplicaSyncCheck(every_n_steps=2)
    with pytest.raises(ReplicaDivergenceError) as caught:
        model.fit(x, y, batch_size=8, epochs=1, callbacks=[inject, check], verbose=0)
    report = caught.value.report
    assert report.step == 4 and int(model.optimizer.iterations.numpy()) == 4
    assert [v.path for v in report.divergences] == [model.layers[1].kernel.path]
    assert model.layers[1].kernel.path in str(caught.value)
    assert isinstance(caught.value, RuntimeError)


def test_an_aggregation_none_weight_assigned_in_call_is_caught(strategy):
    model = _mlp(strategy, extra_layers=[LastBatchMean()])
    x, y = _regression_data(32)
    with pytest.raises(ReplicaDivergenceError) as caught:
        model.fit(x, y, batch_size=8, callbacks=[ReplicaSyncCheck(every_n_steps=1)], verbose=0)
    (diverged,) = caught.value.report.divergences
    assert diverged.path.endswith("last_mean")
    assert diverged.aggregation == "NONE" and diverged.role == replica_state.NON_TRAINABLE
    assert "tensorflow/tensorflow#37834" in diverged.likely_cause
    assert caught.value.report.step == 1


# --- per-replica state --------------------------------------------------------


def test_default_batch_norm_statistics_are_per_replica_state_warned_once(strategy, caplog):
    caplog.set_level(logging.WARNING, logger="keras_scaling")
    model = _mlp(strategy, extra_layers=[keras.layers.BatchNormalization()])
    x, y = _regression_data(32)
    check = ReplicaSyncCheck(every_n_steps=1)
    model.fit(x, y, batch_size=8, callbacks=[check], verbose=0)
    report = check.last_report
    assert report.ok
    batch_norm = model.layers[1]
    assert {v.path for v in report.per_replica_state} == {
        batch_norm.moving_mean.path,
        batch_norm.moving_variance.path,
    }
    assert all(v.difference.max_abs_diff > 0 for v in report.per_replica_state)
    warnings = [r.getMessage() for r in caplog.records if "per-replica state" in r.getMessage()]
    assert len(warnings) == 1
    assert batch_norm.moving_mean.path in warnings[0] and "max abs diff" in warnings[0]


def test_per_replica_state_average_makes_the_copies_equal(strategy):
    model = _mlp(strategy, extra_layers=[keras.layers.BatchNormalization()])
    x, y = _regression_data(32)
    check = ReplicaSyncCheck(every_n_steps=2, per_replica_state="average")
    model.fit(x, y, batch_size=8, callbacks=[check], verbose=0)
    batch_norm = model.layers[1]
    for variable in (batch_norm.moving_mean, batch_norm.moving_variance):
        first, second = _copies(strategy, variable)
        np.testing.assert_array_equal(first, second)
    assert all(v.repair == "averaged across replicas" for v in check.last_report.per_replica_state)


def test_per_replica_state_error_treats_batch_norm_statistics_as_divergence(strategy):
    model = _mlp(strategy, extra_layers=[keras.layers.BatchNormalization()])
    x, y = _regression_data(32)
    check = ReplicaSyncCheck(every_n_steps=1, per_replica_state="error")
    with pytest.raises(ReplicaDivergenceError) as caught:
        model.fit(x, y, batch_size=8, callbacks=[check], verbose=0)
    paths = {v.path for v in caught.value.report.divergences}
    assert model.layers[1].moving_mean.path in paths


def test_per_replica_state_ignore_leaves_it_out(strategy):
    model = _mlp(strategy, extra_layers=[keras.layers.BatchNormalization()])
    x, y = _regression_data(32)
    check = ReplicaSyncCheck(every_n_steps=1, per_replica_state="ignore")
    model.fit(x, y, batch_size=8, callbacks=[check], verbose=0)
    assert check.last_report.variables == ()
    assert (
        check.last_report.num_variables == len(model.variables) + len(model.optimizer.variables) - 2
    )


# --- repairs, warnings, tolerance, logs ---------------------------------------


def test_resync_repairs_and_training_goes_on_with_equal_weights(strategy, caplog):
    caplog.set_level(logging.WARNING, logger="keras_scaling")
    model = _mlp(strategy, optimizer="adam")
    x, y = _regression_data(64)
    inject = AssignOnReplica1(strategy, lambda: model.layers[0].kernel, 2, lambda v: v * 3)
    check = ReplicaSyncCheck(every_n_steps=3, on_divergence="resync")
    model.fit(x, y, batch_size=8, callbacks=[inject, check], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 8
    repaired = [r.getMessage() for r in caplog.records if "resynced" in r.getMessage()]
    assert len(repaired) == 1 and model.layers[0].kernel.path in repaired[0]
    for variable in model.variables + model.optimizer.variables:
        first, second = _copies(strategy, variable)
        np.testing.assert_array_equal(first, second, err_msg=variable.path)
    assert check.check().variables == ()


def test_warn_logs_the_divergence_and_writes_scalars(strategy, caplog, tmp_path):
    caplog.set_level(logging.WARNING, logger="keras_scaling")
    model = _mlp(strategy)
    x, y = _regression_data(32)
    inject = AssignOnReplica1(strategy, lambda: model.layers[1].bias, 1, lambda v: v + 0.25)
    check = ReplicaSyncCheck(every_n_steps=2, on_divergence="warn", log_dir=str(tmp_path))
    model.fit(x, y, batch_size=8, callbacks=[inject, check], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 4
    assert any("copies diverged" in r.getMessage() for r in caplog.records)
    diverged = _scalars(str(tmp_path), "replica_sync/diverged_variables")
    assert diverged == [(0, 0.0), (2, 1.0), (4, 1.0)]
    max_abs = dict(_scalars(str(tmp_path), "replica_sync/max_abs_diff"))
    assert max_abs[0] == 0.0 and max_abs[2] == pytest.approx(0.25, rel=1e-3)


def test_differences_within_tolerance_are_float_drift_not_divergence(strategy, caplog):
    caplog.set_level(logging.WARNING, logger="keras_scaling")
    model = _mlp(strategy)
    kernel = model.layers[0].kernel
    copy = strategy.experimental_local_results(kernel.value)[1]
    copy.assign(copy.numpy() + 1e-6)
    check = ReplicaSyncCheck(atol=1e-4)
    x, y = _regression_data(16)
    model.fit(x, y, batch_size=8, callbacks=[check], verbose=0)
    report = check.last_report
    assert report.ok and [v.path for v in report.float_drift] == [kernel.path]
    assert any("float drift" in r.getMessage() for r in caplog.records)
    with pytest.raises(ReplicaDivergenceError):
        model.fit(x, y, batch_size=8, callbacks=[ReplicaSyncCheck()], verbose=0)


# --- arguments and one replica ------------------------------------------------


@pytest.mark.logical_cpus(1)
@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"every_n_steps": 0}, ValueError, "every_n_steps must be a positive integer, got 0$"),
        (
            {"every_n_steps": 2.5},
            TypeError,
            "every_n_steps must be a positive integer, got float 2.5$",
        ),
        (
            {"every_n_steps": True},
            TypeError,
            "every_n_steps must be a positive integer, got bool True$",
        ),
        (
            {"on_divergence": "panic"},
            ValueError,
            "on_divergence must be one of 'raise', 'warn', 'resync', got 'panic'$",
        ),
        ({"on_divergence": None}, TypeError, "on_divergence must be one of .*, got None$"),
        (
            {"per_replica_state": "sum"},
            ValueError,
            "per_replica_state must be one of 'warn', 'ignore', 'error', 'average', got 'sum'$",
        ),
        (
            {"atol": -1e-3},
            ValueError,
            r"atol must be a number >= 0, got -0.001. 0 means bitwise equality$",
        ),
        (
            {"rtol": float("nan")},
            ValueError,
            r"rtol must be a number >= 0, got nan. 0 means bitwise equality$",
        ),
        (
            {"rtol": "0.1"},
            TypeError,
            r"rtol must be a number >= 0, got str '0.1'. 0 means bitwise equality$",
        ),
        ({"log_dir": 3}, TypeError, "log_dir must be a path .*, got int"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        ReplicaSyncCheck(**kwargs)


@pytest.mark.logical_cpus(1)
def test_one_replica_does_nothing_and_says_so_once(caplog):
    caplog.set_level(logging.WARNING, logger="keras_scaling")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    check = ReplicaSyncCheck(every_n_steps=1)
    x, y = _regression_data(32)
    model.fit(x, y, batch_size=8, epochs=2, callbacks=[check], verbose=0)
    report = check.check()
    assert report.ok and report.num_replicas == 1 and report.num_variables == 0
    said = [r for r in caplog.records if "one replica" in r.getMessage()]
    assert len(said) == 1


def test_check_without_a_model_says_how_to_give_one():
    with pytest.raises(ValueError, match="needs a model"):
        ReplicaSyncCheck().check()
