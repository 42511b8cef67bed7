"""The public API is typed: every parameter and return of what `__all__` exports has a hint.

Walks `__all__` of `keras_scaling` and of each public module: every public
function, every class's constructor, and each public method and property a
class defines in keras_scaling (what it inherits from Keras is Keras' own
business). The hints are what editors and type checkers read, and
`keras_scaling/py.typed` tells them to read them. Importing the modules does
not initialise TensorFlow's devices, so this runs in any pytest session.
"""

import importlib
import inspect
import pathlib

import pytest

import keras_scaling

PUBLIC_MODULES = (
    "keras_scaling",
    "keras_scaling.baseline",
    "keras_scaling.callbacks",
    "keras_scaling.cluster",
    "keras_scaling.compat",
    "keras_scaling.data",
    "keras_scaling.devices",
    "keras_scaling.doctor",
    "keras_scaling.explain",
    "keras_scaling.flops",
    "keras_scaling.launcher",
    "keras_scaling.peak_flops",
    "keras_scaling.replica_state",
    "keras_scaling.throughput",
    "keras_scaling.tune",
    "keras_scaling.utilization",
)


def _defined_in_package(value):
    return (getattr(value, "__module__", None) or "").startswith("keras_scaling")


def _public_members(cls):
    """(name, function) of the public methods and property getters `cls` defines.

    Those it inherits from a class of keras_scaling are checked with that
    class; dunder methods other than `__init__` follow Python's own protocols.
    """
    members = []
    for name, value in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(value, property):
            value = value.fget
        elif isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value):
            members.append((name, value))
    return members


def _public_functions():
    """(qualified name, function) of every function and method the public API reaches."""
    found = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isfunction(value) and _defined_in_package(value):
                found[f"{value.__module__}.{value.__qualname__}"] = value
            elif inspect.isclass(value) and _defined_in_package(value):
                for cls in value.__mro__:
                    if not _defined_in_package(cls):
                        continue
                    for _, function in _public_members(cls):
                        found[f"{cls.__module__}.{function.__qualname__}"] = function
    return sorted(found.items())


def missing_hints(function):
    """The names of `function`'s parameters without a hint, and "return" if it has none.

    `self` and `cls` are left out; a dataclass's generated `__init__` and a
    property's getter are functions like any other.
    """
    signature = inspect.signature(function)
    missing = [
        parameter.name
        for index, parameter in enumerate(signature.parameters.values())
        if parameter.annotation is inspect.Parameter.empty
        and not (index == 0 and parameter.name in ("self", "cls"))
    ]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


PUBLIC_FUNCTIONS = _public_functions()


def test_missing_hints_names_each_unannotated_parameter_and_the_return():
    def partly(self, a: int, b, *args, c: str = "", **kwargs):
        return a

    def typed(a: int, *, b: str | None = None) -> int:
        return a

    assert missing_hints(partly) == ["b", "args", "kwargs", "return"]
    assert missing_hints(typed) == []


def test_the_walk_reaches_functions_classes_methods_and_properties():
    names = {name for name, _ in PUBLIC_FUNCTIONS}

    assert "keras_scaling.throughput.arithmetic.speedup" in names
    assert "keras_scaling.throughput.arithmetic.ThroughputWindow.update" in names
    assert "keras_scaling.throughput.arithmetic.Interval.samples_per_sec" in names
    assert "keras_scaling.throughput.arithmetic.Interval.__init__" in names
    assert "keras_scaling.throughput.throughput_logger.ThroughputLogger.__init__" in names
    assert "keras_scaling.throughput.throughput_logger.ThroughputLogger.on_train_begin" in names
    assert "keras_scaling.devices.strategies.use_logical_cpus" in names


@pytest.mark.parametrize(
    "qualified_name, function", PUBLIC_FUNCTIONS, ids=[name for name, _ in PUBLIC_FUNCTIONS]
)
def test_public_function_has_hints_on_every_parameter_and_its_return(qualified_name, function):
    missing = missing_hints(function)

    assert not missing, f"{qualified_name} has no type hint on: {', '.join(missing)}"


def test_the_package_ships_the_py_typed_marker():
    # PEP 561: without the marker, type checkers ignore the package's hints.
    marker = pathlib.Path(keras_scaling.__file__).parent / "py.typed"

    assert marker.is_file()
