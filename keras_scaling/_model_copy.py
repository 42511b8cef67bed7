"""A copy of a Keras model to time alone: what `explain`'s one-replica variant and the measured baseline train."""

import contextlib
import os
import tempfile
import warnings


def copy_of(model, scope=contextlib.nullcontext, *, weights=True):
    """`model` made again inside `scope()` and compiled as `model` is.

    A model with a layer that keeps assets (an adapted `TextVectorization`
    or `StringLookup`, a keras-hub preprocessor) is saved and loaded as a
    `.keras` file, which carries them; any other is rebuilt from its config,
    with `model`'s weights when `weights`. Custom layers need no registration.

    Raises:
        Exception: what Keras raises for a model it cannot rebuild (a
            subclassed model without `get_config`, say).
    """
    import keras

    from keras_scaling.internals import _keras

    layers = _keras.all_layers(model)
    # Each class under the name its config gives it.
    classes = {type(layer).__name__: type(layer) for layer in layers}
    # Read outside the new scope: mirrored variables refuse another strategy.
    compile_config = model.get_compile_config()
    if not any(hasattr(layer, "save_assets") for layer in layers):
        config, values = model.get_config(), model.get_weights() if weights else None
        with scope(), keras.saving.custom_object_scope(classes):
            copy = type(model).from_config(config)
            if values is not None:
                copy.set_weights(values)
            _compile(copy, compile_config, model)
        return copy
    with tempfile.TemporaryDirectory(prefix="keras_scaling_copy_") as directory:
        path = os.path.join(directory, "model.keras")
        model.save(path)
        # Keras' notes on loading (a custom compile, optimizer variables
        # skipped) concern this internal copy, not the user's model.
        with scope(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            copy = keras.saving.load_model(path, custom_objects=classes)
            if not copy.compiled:
                _compile(copy, compile_config, model)
    return copy


def _compile(copy, compile_config, model):
    """Compiles `copy` from `model`'s compile config, or with a fresh optimizer of its class and its loss."""
    if compile_config:
        copy.compile_from_config(compile_config)
    else:
        copy.compile(optimizer=model.optimizer.__class__(), loss=model.loss)
