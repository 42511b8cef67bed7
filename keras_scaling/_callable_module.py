"""Packages callable as their function of the same name: `keras_scaling.explain(...)`."""

import sys
import types
from collections.abc import Callable
from typing import Any


def make_callable(module_name: str, function: Callable[..., Any]) -> None:
    """Makes module `module_name` callable as `function`, whichever the name is bound to.

    (Importing a submodule binds the package's name in its parent to the package.)
    """

    class CallableModule(types.ModuleType):
        __call__ = staticmethod(function)

    sys.modules[module_name].__class__ = CallableModule
