"""Argument checks shared by every public entry point.

A value of the wrong type (a bool where an integer is due, too) raises
`TypeError`, one out of range `ValueError`; both name the parameter, what was
received and the fix when one is known. NumPy numbers are accepted as Python's.
"""

import math
import numbers
import os
import tempfile

import numpy as np


def _suffix(fix):
    return f". {fix}" if fix else ""


def _is_integer(value):
    # Python's own types first: the training path calls these.
    return type(value) is int or (
        isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    )


def _is_real(value):
    return type(value) in (float, int) or (
        isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    )


def _type_error(parameter, what, value, fix):
    return TypeError(
        f"{parameter} must be {what}, got {type(value).__name__} {value!r}{_suffix(fix)}"
    )


def integer_wording(minimum):
    """ "a positive integer" for `minimum` 1, else "an integer >= 0" and the like."""
    return "a positive integer" if minimum == 1 else f"an integer >= {minimum}"


def integer_at_least(value, parameter, minimum, *, fix=None):
    """Returns `value` as an `int`, checked to be an integer >= `minimum`: `np.int64(3)` gives 3."""
    what = integer_wording(minimum)
    if not _is_integer(value):
        raise _type_error(parameter, what, value, fix)
    if value < minimum:
        raise ValueError(f"{parameter} must be {what}, got {value!r}{_suffix(fix)}")
    return int(value)


def positive_int(value, parameter, *, fix=None):
    return integer_at_least(value, parameter, 1, fix=fix)


def non_negative_int(value, parameter, *, fix=None):
    return integer_at_least(value, parameter, 0, fix=fix)


def optional_positive_int(value, parameter, *, fix=None):
    return None if value is None else positive_int(value, parameter, fix=fix)


def _number(value, parameter, what, in_range, fix):
    if not _is_real(value):
        raise _type_error(parameter, what, value, fix)
    if not (in_range(value) and math.isfinite(value)):
        raise ValueError(f"{parameter} must be {what}, got {value!r}{_suffix(fix)}")
    return float(value)


def positive_number(value, parameter, *, unit=None, fix=None):
    """Returns `value` as a `float`, checked to be finite and > 0."""
    what = f"a positive number ({unit})" if unit else "a positive number"
    return _number(value, parameter, what, lambda number: number > 0, fix)


def non_negative_number(value, parameter, *, unit=None, fix=None):
    """Returns `value` as a `float`, checked to be finite and >= 0."""
    what = f"a number >= 0 ({unit})" if unit else "a number >= 0"
    return _number(value, parameter, what, lambda number: number >= 0, fix)


def boolean(value, parameter, *, fix=None):
    """Returns `value`, checked to be `True` or `False` (NumPy's `bool_` too)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise _type_error(parameter, "True or False", value, fix)


def optional_boolean(value, parameter, *, fix=None):
    if value is None or isinstance(value, (bool, np.bool_)):
        return None if value is None else bool(value)
    raise _type_error(parameter, "True, False or None", value, fix)


def optional_integer(value, parameter, *, fix=None):
    """`None`, or `value` as an `int` of any sign."""
    if value is None:
        return None
    if not _is_integer(value):
        raise _type_error(parameter, "an integer or None", value, fix)
    return int(value)


def positive_number_or_one_of(value, parameter, choices, *, unit=None, fix=None):
    """`value` if one of `choices` (strings or None), else a positive number as a `float`."""
    if value in choices and (value is None or isinstance(value, str)):
        return value
    number = f"a positive number ({unit})" if unit else "a positive number"
    *others, last = [repr(choice) for choice in choices]
    allowed = f"{', '.join(others)} or {last}" if others else last
    message = f"{parameter} must be {number}, {allowed}, got "
    if not _is_real(value):
        error = ValueError if isinstance(value, str) else TypeError
        kind = "" if isinstance(value, str) else f"{type(value).__name__} "
        raise error(f"{message}{kind}{value!r}{_suffix(fix)}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{message}{value!r}{_suffix(fix)}")
    return float(value)


def one_of(value, parameter, choices, *, fix=None):
    """Returns `value`, checked to be one of `choices` (strings or None)."""
    if value in choices and (value is None or isinstance(value, str)):
        return value
    allowed = ", ".join(repr(choice) for choice in choices)
    error = ValueError if isinstance(value, str) else TypeError
    raise error(f"{parameter} must be one of {allowed}, got {value!r}{_suffix(fix)}")


def writable_directory(path, parameter, who):
    """Creates `path` when missing and checks a file can be written there, before training."""
    path = os.fspath(path)
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix=".keras_scaling-write-check-", dir=path):
            pass
    except OSError as error:
        raise OSError(
            error.errno,
            f"{who}: cannot write to {parameter}={path!r} ({error.strerror}). Training did "
            f"not start. Pass a {parameter} that is writable.",
        ) from error
