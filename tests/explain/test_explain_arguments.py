"""explain refuses bad input with an error that names the parameter and the fix."""

import numpy as np
import pytest

import keras_scaling


def _model(compiled=True):
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    if compiled:
        model.compile(optimizer="sgd", loss="mse")
    return model


_ARRAYS = (np.zeros((16, 4), "float32"), np.zeros((16, 1), "float32"))


def test_a_model_that_is_not_compiled_is_refused():
    with pytest.raises(ValueError, match=r"model must be compiled: call model.compile"):
        keras_scaling.explain(_model(compiled=False), _ARRAYS, per_replica_batch_size=4)


def test_array_data_without_a_per_replica_batch_is_refused():
    with pytest.raises(ValueError, match="per_replica_batch_size is needed for array data"):
        keras_scaling.explain(_model(), _ARRAYS)


@pytest.mark.parametrize("parameter", ["steps", "rounds"])
def test_fewer_than_two_steps_or_rounds_are_refused(parameter):
    with pytest.raises(ValueError, match=parameter):
        keras_scaling.explain(_model(), _ARRAYS, per_replica_batch_size=4, **{parameter: 1})


def test_amortized_steps_per_execution_must_exceed_the_models():
    with pytest.raises(ValueError, match="amortized_steps_per_execution must exceed"):
        keras_scaling.explain(
            _model(), _ARRAYS, per_replica_batch_size=4, amortized_steps_per_execution=1
        )


def test_the_package_is_callable_as_its_function():
    import keras_scaling.explain as package

    assert callable(package)
    assert callable(keras_scaling.explain)


def _refused_before_measuring(monkeypatch):
    """Makes any measurement fail the test: a refusal must come first."""
    from keras_scaling.explain import _measure

    def measure(*args, **kwargs):
        raise AssertionError("explain measured before refusing the argument")

    monkeypatch.setattr(_measure, "measure", measure)


@pytest.mark.parametrize(
    "peak_flops, error",
    [(None, TypeError), ("fast", ValueError), (0, ValueError), (-1e12, ValueError)],
)
def test_a_peak_flops_that_cannot_work_is_refused_before_any_measurement(
    monkeypatch, peak_flops, error
):
    _refused_before_measuring(monkeypatch)
    with pytest.raises(
        error, match=r"peak_flops must be .*'auto' or 'measure'.*Leave it at 'auto'"
    ):
        keras_scaling.explain(_model(), _ARRAYS, per_replica_batch_size=4, peak_flops=peak_flops)


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(model="model"), TypeError, "model must be a compiled keras.Model, got str"),
        (dict(strategy="mirrored"), TypeError, "strategy must be a tf.distribute.Strategy"),
        (dict(per_replica_batch_size=0), ValueError, "per_replica_batch_size must be a positive"),
        (dict(per_replica_batch_size=2.5), TypeError, "per_replica_batch_size must be a positive"),
        (dict(verbose="yes"), TypeError, "verbose must be True or False"),
    ],
)
def test_other_arguments_that_cannot_work_are_refused_before_any_measurement(
    monkeypatch, arguments, error, message
):
    _refused_before_measuring(monkeypatch)
    call = dict(model=_model(), data=_ARRAYS, per_replica_batch_size=4)
    call.update(arguments)
    with pytest.raises(error, match=message):
        keras_scaling.explain(call.pop("model"), call.pop("data"), **call)


def test_a_log_dir_that_cannot_be_written_is_refused_before_any_measurement(monkeypatch, tmp_path):
    _refused_before_measuring(monkeypatch)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(OSError, match="cannot write to log_dir="):
        keras_scaling.explain(
            _model(), _ARRAYS, per_replica_batch_size=4, log_dir=str(blocker / "logs")
        )


def test_with_log_dir_it_writes_its_run_and_leaves_no_event_file_open(tmp_path):
    from keras_scaling.summaries import _tensorboard

    keras_scaling.explain(
        _model(), _ARRAYS, per_replica_batch_size=4, steps=2, rounds=2, log_dir=str(tmp_path),
        verbose=False,
    )  # fmt: skip

    run = tmp_path / "explain"
    assert "explain/verdict" in _tensorboard.read_summaries(run)
    # Closed when explain returns: no writer thread of TensorBoard's is left behind.
    assert str(run) not in _tensorboard.open_event_files()
