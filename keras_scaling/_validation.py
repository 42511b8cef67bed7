"""Argument checks shared by every public entry point.

One wording and one behaviour everywhere: a value of the wrong type (a
string, a float, a bool where an integer is due) raises `TypeError`, a value
of the right type out of range raises `ValueError`, and both name the
parameter, what was received and, where one is known, the fix. NumPy integers
and floats are accepted wherever Python ones are.
"""

import math
import numbers

import numpy as np


def _suffix(fix):
    return f". {fix}" if fix else ""


# Checked on the training path: Python numbers take the first test and skip
# the slower abstract-base-class checks.


def _is_integer(value):
    return type(value) is int or (
        isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    )


def _is_real(value):
    return type(value) in (float, int) or (
        isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    )


def integer_wording(minimum):
    """How an integer of at least `minimum` is asked for: "a positive integer", "an integer >= 0"."""
    return "a positive integer" if minimum == 1 else f"an integer >= {minimum}"


def integer_at_least(value, parameter, minimum, *, fix=None):
    """Returns `value` as an `int`, checked to be an integer >= `minimum`.

    Example: `integer_at_least(np.int64(3), "num_workers", 1)` is `3`.
    """
    what = integer_wording(minimum)
    if not _is_integer(value):
        raise TypeError(
            f"{parameter} must be {what}, got {type(value).__name__} {value!r}{_suffix(fix)}"
        )
    if value < minimum:
        raise ValueError(f"{parameter} must be {what}, got {value!r}{_suffix(fix)}")
    return int(value)


def positive_int(value, parameter, *, fix=None):
    """Returns `value` as an `int`, checked to be an integer >= 1."""
    return integer_at_least(value, parameter, 1, fix=fix)


def non_negative_int(value, parameter, *, fix=None):
    """Returns `value` as an `int`, checked to be an integer >= 0."""
    return integer_at_least(value, parameter, 0, fix=fix)


def optional_positive_int(value, parameter, *, fix=None):
    """`None`, or `value` checked by `positive_int`."""
    return None if value is None else positive_int(value, parameter, fix=fix)


def positive_number(value, parameter, *, unit=None, fix=None):
    """Returns `value` as a `float`, checked to be finite and > 0."""
    what = f"a positive number ({unit})" if unit else "a positive number"
    if not _is_real(value):
        raise TypeError(
            f"{parameter} must be {what}, got {type(value).__name__} {value!r}{_suffix(fix)}"
        )
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{parameter} must be {what}, got {value!r}{_suffix(fix)}")
    return float(value)


def non_negative_number(value, parameter, *, unit=None, fix=None):
    """Returns `value` as a `float`, checked to be finite and >= 0."""
    what = f"a number >= 0 ({unit})" if unit else "a number >= 0"
    if not _is_real(value):
        raise TypeError(
            f"{parameter} must be {what}, got {type(value).__name__} {value!r}{_suffix(fix)}"
        )
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{parameter} must be {what}, got {value!r}{_suffix(fix)}")
    return float(value)


def boolean(value, parameter, *, fix=None):
    """Returns `value`, checked to be `True` or `False` (NumPy's `bool_` too)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(
        f"{parameter} must be True or False, got {type(value).__name__} {value!r}{_suffix(fix)}"
    )


def optional_boolean(value, parameter, *, fix=None):
    """`None`, or `value` checked by `boolean`."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(
        f"{parameter} must be True, False or None, got {type(value).__name__} {value!r}"
        f"{_suffix(fix)}"
    )


def optional_integer(value, parameter, *, fix=None):
    """`None`, or `value` as an `int`, checked to be an integer of any sign."""
    if value is None:
        return None
    if not _is_integer(value):
        raise TypeError(
            f"{parameter} must be an integer or None, got {type(value).__name__} {value!r}"
            f"{_suffix(fix)}"
        )
    return int(value)


def positive_number_or_one_of(value, parameter, choices, *, unit=None, fix=None):
    """Returns `value`: one of `choices` as it is, or a positive number as a `float`.

    Example: `positive_number_or_one_of("auto", "peak_flops", ("auto", None))`
    is `"auto"`, and `np.float32(2.5)` gives `2.5`.
    """
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
    """Creates `path` when missing and checks that a file can be written there.

    Called when `fit` starts, so that a read-only or full directory is found
    before training, not at the first save.

    Raises:
        OSError: (with the errno of the failure) naming `parameter`, the
            directory and what to do.
    """
    import os
    import tempfile

    path = os.fspath(path)
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix=".keras_scaling-write-check-", dir=path):
            pass
    except OSError as error:
        raise OSError(
            error.errno,
            f"{who}: cannot write to {parameter}={path!r} ({error.strerror}). "
            f"Training did not start. Pass a {parameter} that is writable (a "
            "read-only mount or missing permissions cannot take its files).",
        ) from error
