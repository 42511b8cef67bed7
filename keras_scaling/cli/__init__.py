"""The `keras-scaling` command line (also `python -m keras_scaling`): bench, report, launch, doctor, tune."""

import argparse
import sys

from keras_scaling.cli import _worker, bench, doctor, launch, report, tune
from keras_scaling.cli._errors import UsageError


def main(argv=None):
    """Runs `keras-scaling` with `argv` (default `sys.argv[1:]`); returns the exit status.

    Bad input prints a message on stderr and returns 2, without a traceback; Ctrl-C returns 130.
    """
    if argv is None:  # the process's own command line: the process is the command's
        _worker.end_without_final_collection()
    parser = argparse.ArgumentParser(
        prog="keras-scaling",
        description="Measure and show data-parallel Keras training on tf.distribute.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (bench, report, launch, doctor, tune):
        command.add_parser(subparsers)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        return args.run(args)
    except UsageError as error:
        print(f"keras-scaling {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"keras-scaling {args.command}: interrupted", file=sys.stderr)
        return 130
