"""Argument types shared by the subcommands, worded as `keras_scaling._validation` words them."""

import argparse

from keras_scaling import _validation


def _integer_at_least(text, minimum):
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise argparse.ArgumentTypeError(
            f"must be {_validation.integer_wording(minimum)}, got {text!r}"
        )
    return value


def positive_int(text):
    """An argparse `type`: a positive integer, or a message naming what was given."""
    return _integer_at_least(text, 1)


def non_negative_int(text):
    """An argparse `type`: an integer >= 0, or a message naming what was given."""
    return _integer_at_least(text, 0)


def positive_number(unit):
    """An argparse `type`: a positive number of `unit`, or a message naming what was given."""

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be a positive number of {unit}, got {text!r}")
        return value

    return parse
