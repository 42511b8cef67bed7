"""The public API: what each public module exports, and how it is documented.

Every public function and class has a docstring with an `Example:`, and with
`Args:` when it takes parameters (for a class: its constructor's). Constants
are exempt. Importing the modules does not initialise TensorFlow's devices,
so this runs in any pytest session.
"""

import ast
import importlib
import inspect
import pathlib

import pytest

import keras_scaling

PUBLIC_MODULES = (
    "keras_scaling",
    "keras_scaling.callbacks",
    "keras_scaling.cluster",
    "keras_scaling.compat",
    "keras_scaling.data",
    "keras_scaling.devices",
    "keras_scaling.devices.strategies",
    "keras_scaling.doctor",
    "keras_scaling.explain",
    "keras_scaling.launch.launcher",
    "keras_scaling.mfu.flops",
    "keras_scaling.mfu.peak_flops",
    "keras_scaling.mfu.utilization",
    "keras_scaling.replica_sync.replica_state",
    "keras_scaling.replica_sync.replica_sync_check",
    "keras_scaling.throughput",
    "keras_scaling.throughput.arithmetic",
    "keras_scaling.throughput.baseline",
    "keras_scaling.throughput.throughput_logger",
    "keras_scaling.tune",
)

PACKAGE_DIR = pathlib.Path(keras_scaling.__file__).parent


def _public_callables(module_name):
    """(qualified name, object) of every function and class in `__all__`.

    A missing `__all__` or name is reported by the test of `__all__`, not here.
    """
    module = importlib.import_module(module_name)
    found = []
    for name in getattr(module, "__all__", ()):
        value = getattr(module, name, None)
        if inspect.isclass(value) or inspect.isfunction(value):
            found.append((f"{module_name}.{name}", value))
    return found


def _parameters(value):
    """The parameters a user passes: a function's, or a class constructor's."""
    if inspect.isclass(value):
        if value.__init__ is object.__init__:
            return []
        parameters = list(inspect.signature(value.__init__).parameters.values())
        return parameters[1:]  # self
    return list(inspect.signature(value).parameters.values())


def _public_module_files(directory=PACKAGE_DIR):
    """The files of the package's modules and subpackages, except private ones."""
    paths = [directory / "__init__.py"]
    for path in sorted(directory.iterdir()):
        if path.name.startswith("_"):
            continue
        if path.suffix == ".py":
            paths.append(path)
        elif path.is_dir() and (path / "__init__.py").is_file():
            paths.extend(_public_module_files(path))
    return paths


PUBLIC_CALLABLES = [
    item for module_name in PUBLIC_MODULES for item in _public_callables(module_name)
]


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_public_module_defines_all_and_every_name_resolves(module_name):
    module = importlib.import_module(module_name)
    assert hasattr(module, "__all__"), f"{module_name} defines no __all__"
    assert len(set(module.__all__)) == len(module.__all__), (
        f"{module_name}.__all__ lists a name twice"
    )
    for name in module.__all__:
        assert not name.startswith("_"), f"{module_name}.__all__ lists private {name}"
        assert hasattr(module, name), f"{module_name}.{name} is in __all__ but missing"


@pytest.mark.parametrize(
    "qualified_name, value", PUBLIC_CALLABLES, ids=[name for name, _ in PUBLIC_CALLABLES]
)
def test_public_function_or_class_docstring_has_an_example(qualified_name, value):
    doc = inspect.getdoc(value) or ""
    assert doc.strip(), f"{qualified_name} has no docstring"
    assert "Example" in doc, f"{qualified_name}'s docstring has no Example"


@pytest.mark.parametrize(
    "qualified_name, value", PUBLIC_CALLABLES, ids=[name for name, _ in PUBLIC_CALLABLES]
)
def test_public_function_or_class_with_parameters_documents_args(qualified_name, value):
    parameters = _parameters(value)
    if not parameters:
        return
    doc = inspect.getdoc(value) or ""
    names = ", ".join(parameter.name for parameter in parameters)
    assert "Args" in doc, f"{qualified_name} takes ({names}) but its docstring has no Args"


@pytest.mark.parametrize(
    "path", _public_module_files(), ids=lambda path: str(path.relative_to(PACKAGE_DIR))
)
def test_public_module_has_a_docstring(path):
    # Read from the source: importing every module (the CLI among them) is not
    # needed to see its docstring.
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert (ast.get_docstring(tree) or "").strip(), f"{path} has no module docstring"
