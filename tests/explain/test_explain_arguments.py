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
