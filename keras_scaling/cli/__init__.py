"""The `keras-scaling` command line: `bench`, `report`, `launch`, `doctor` and `tune`.

`keras-scaling bench` measures the speedup of data-parallel training over
replica counts; `keras-scaling report LOGDIR` prints the same table for
runs logged earlier by `ThroughputLogger`; `keras-scaling launch` starts
local multi-worker training; `keras-scaling doctor` checks versions,
collectives and bandwidth on every worker of a cluster; `keras-scaling
tune` finds the fastest settings for a model by measurement. `python -m
keras_scaling` is the same program.
"""

import argparse
import sys

from keras_scaling.cli import bench, doctor, launch, report, tune
from keras_scaling.cli._errors import UsageError

_PROG = "keras-scaling"


def _parser():
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Measure and show data-parallel Keras training on tf.distribute.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    bench.add_parser(subparsers)
    report.add_parser(subparsers)
    launch.add_parser(subparsers)
    doctor.add_parser(subparsers)
    tune.add_parser(subparsers)
    return parser


def main(argv=None):
    """Runs `keras-scaling` with `argv` (default `sys.argv[1:]`); returns the exit status.

    Bad input prints a message on stderr and returns 2, without a traceback.

    Example:

    ```python
    from keras_scaling.cli import main
    main(["report", "logs/bench"])
    ```
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        return args.run(args)
    except UsageError as error:
        print(f"{_PROG} {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{_PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
