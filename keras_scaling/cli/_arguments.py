"""Argument types shared by the subcommands."""

import argparse


def positive_int(text):
    """An argparse `type`: a positive integer, or a message naming what was given."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a positive integer, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value
