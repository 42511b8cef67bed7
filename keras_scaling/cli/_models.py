"""The models of `bench` and `tune`: presets, `package.module:function` specs (called without arguments in the strategy's scope), synthetic data."""

import importlib
import sys

from keras_scaling.cli._errors import UsageError

PRESETS = ("mlp", "cnn", "resnet50")
_NUM_CLASSES = 10
_DATA_FIX = (
    "pass --data package.module:function, a function without arguments that returns "
    "your data (a tf.data.Dataset of samples, arrays (x, y) or a keras.utils.PyDataset)"
)


def check_specs(args):
    """Raises `UsageError` unless `--model` is a preset or an importable callable, and `--data` one."""
    if args.model not in PRESETS and ":" not in args.model:
        raise UsageError(
            f"--model {args.model!r} is neither a preset ({', '.join(PRESETS)}) nor "
            "package.module:function"
        )
    if args.model not in PRESETS:
        _import_function(args.model)
    if args.data is not None:
        _import_function(args.data, option="--data")


def load_data(spec):
    """Calls the `--data` function: a dataset of samples, arrays or a `PyDataset`."""
    return _import_function(spec, option="--data")()


def _import_function(spec, option="--model"):
    """The function `spec` names; the current directory is importable, as with `python -m`."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise UsageError(f"{option} {spec!r} must have the form package.module:function")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    try:
        function = getattr(importlib.import_module(module_name), function_name, None)
    except ImportError as error:
        raise UsageError(
            f"{option} {spec!r}: cannot import module {module_name!r} ({error}); "
            "run from the directory that holds it or add it to PYTHONPATH"
        ) from None
    if function is None:
        raise UsageError(
            f"{option} {spec!r}: module {module_name!r} has no attribute {function_name!r}"
        )
    if not callable(function):
        kind = type(function).__name__
        raise UsageError(f"{option} {spec!r}: {function_name!r} is a {kind}, not a function")
    return function


def build_model(spec):
    """Builds the model of `spec`; call it inside the strategy's scope."""
    import keras

    layers = keras.layers
    if spec == "mlp":
        hidden = [layers.Dense(512, activation="relu"), layers.Dense(512, activation="relu")]
        return keras.Sequential(
            [keras.Input((784,)), *hidden, layers.Dense(_NUM_CLASSES)], name=spec
        )
    if spec == "cnn":
        hidden = [layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D()]
        hidden += [layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(), layers.Flatten()]
        hidden += [layers.Dense(128, activation="relu"), layers.Dense(_NUM_CLASSES)]
        return keras.Sequential([keras.Input((32, 32, 3)), *hidden], name=spec)
    if spec == "resnet50":
        return keras.applications.ResNet50(
            weights=None, input_shape=(32, 32, 3), classes=_NUM_CLASSES
        )
    model = _import_function(spec)()
    if not isinstance(model, keras.Model):
        raise UsageError(
            f"--model {spec!r} returned {type(model).__name__}, not a keras.Model; "
            "the function must return the model"
        )
    return model


def compile_for_bench(model, spec, steps_per_execution):
    """Compiles `model` unless it is: SGD, with sparse cross-entropy for presets, else MSE."""
    import keras

    if model.compiled:
        if steps_per_execution != 1:
            raise UsageError(
                f"--steps-per-execution {steps_per_execution} applies to models the bench "
                f"compiles, but --model {spec!r} returned a compiled model; compile it "
                "with steps_per_execution instead"
            )
        return
    if spec in PRESETS:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=spec != "resnet50")
    else:
        loss = "mean_squared_error"
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
        loss=loss,
        steps_per_execution=steps_per_execution,
    )


def build_compiled(spec, steps_per_execution, strategy):
    """`build_model` in `strategy`'s scope, then `compile_for_bench`."""
    with strategy.scope():
        model = build_model(spec)
        compile_for_bench(model, spec, steps_per_execution)
    return model


def synthetic_data(model, num_samples, seed=0):
    """Random `(x, y)` NumPy arrays shaped for `model`; targets follow its loss."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = [_random_array(rng, num_samples, shape, dtype) for shape, dtype in _shapes(model, "inputs")]
    kind = _target_kind(model)
    y = [_random_target(rng, num_samples, shape, kind) for shape, _ in _shapes(model, "outputs")]
    return (x[0] if len(x) == 1 else tuple(x)), (y[0] if len(y) == 1 else tuple(y))


def _shapes(model, which):
    try:
        tensors = getattr(model, which)
    except (AttributeError, ValueError):
        tensors = None
    if not tensors:
        raise UsageError(
            f"the model has no defined {which}, so the bench cannot make synthetic "
            f"data for it: {_DATA_FIX}, or build the model on keras.Input(shape=...)"
        )
    for tensor in tensors:
        # Every keras-hub backbone takes inputs of any length: --data is the fix.
        if any(dim is None for dim in tensor.shape[1:]):
            raise UsageError(
                f"the model's {which} have unknown dimensions {tensor.shape}, so the "
                f"bench cannot make synthetic data for them: {_DATA_FIX}"
            )
    return [(tuple(tensor.shape[1:]), str(tensor.dtype)) for tensor in tensors]


def _random_array(rng, num_samples, shape, dtype):
    if "int" in dtype:
        return rng.integers(0, 2, size=(num_samples, *shape)).astype(dtype)
    return rng.random((num_samples, *shape), dtype="float32")


def _target_kind(model):
    """`labels`, `one_hot` or `values`, from the name of the model's loss."""
    loss = getattr(model, "loss", None)
    loss = getattr(loss, "fn", loss)  # a keras.losses.Loss wraps its function
    name = loss if isinstance(loss, str) else getattr(loss, "__name__", type(loss).__name__)
    name = name.lower().replace("_", "")
    if "sparsecategorical" in name:
        return "labels"
    if "categoricalcrossentropy" in name or "categoricalfocal" in name:
        return "one_hot"
    return "values"


def _random_target(rng, num_samples, shape, kind):
    import numpy as np

    if kind == "values":
        return rng.random((num_samples, *shape), dtype="float32")
    num_classes = shape[-1] if shape else 1
    labels = rng.integers(0, num_classes, size=(num_samples, *shape[:-1]))
    return labels if kind == "labels" else np.eye(num_classes, dtype="float32")[labels]
