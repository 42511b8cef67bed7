"""argparse `type`s shared by the subcommands; their messages name what was given."""

import argparse
import math
import os
import time

from keras_scaling import _validation


def _integer_at_least(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            wording = _validation.integer_wording(minimum)
            raise argparse.ArgumentTypeError(f"must be {wording}, got {text!r}")
        return value

    return parse


positive_int = _integer_at_least(1)
non_negative_int = _integer_at_least(0)


def number(unit, low=0.0, high=math.inf, high_text=None, low_included=False):
    """A number of `unit` above `low` (from it with `low_included`), at most `high`; never nan."""

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        # No comparison holds for nan, and inf is above any finite `high`.
        if not ((value >= low if low_included else value > low) and value <= high):
            bounds = f"{'at least' if low_included else 'above'} {low:g}"
            if high < math.inf:
                bounds += f" and at most {high_text or f'{high:g}'}"
            raise argparse.ArgumentTypeError(f"must be a number of {unit} {bounds}, got {text!r}")
        return value

    return parse


def log_dir_of(logdir, command):
    """The absolute `--logdir`, by default `logs/COMMAND-YYYYmmdd-HHMMSS`; raises `UsageError` for a file."""
    from keras_scaling.cli._errors import UsageError

    log_dir = os.path.abspath(logdir or time.strftime(f"logs/{command}-%Y%m%d-%H%M%S"))
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        raise UsageError(f"--logdir {log_dir!r} is a file; pass a directory")
    return log_dir


def add_model_options(parser, command, outputs):
    """Adds --model, --data, --cpu-devices, --steps-per-execution and --logdir.

    `command` (`"bench"`) names the subcommand, `outputs` what LOGDIR receives.
    """
    from keras_scaling.cli._models import PRESETS

    add = parser.add_argument
    model_help = f"{', '.join(PRESETS)} or a function returning a keras.Model (default: mlp)"
    add("--model", default="mlp", metavar="PRESET|package.module:function", help=model_help)
    data_help = (
        "your data instead of synthetic data: a function returning a tf.data.Dataset of "
        "samples, arrays (x, y) or a keras.utils.PyDataset"
    )
    add("--data", metavar="package.module:function", help=data_help)
    add("--cpu-devices", type=positive_int, metavar="N", help="N logical CPUs instead of the GPUs")
    compile_help = f"steps per compiled call, for models {command} compiles (default 1)"
    add("--steps-per-execution", type=positive_int, default=1, metavar="K", help=compile_help)
    logdir_help = f"where to write {outputs} (default: logs/{command}-YYYYmmdd-HHMMSS)"
    add("--logdir", "--log-dir", dest="logdir", metavar="LOGDIR", help=logdir_help)
