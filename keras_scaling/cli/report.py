"""`keras-scaling report LOGDIR`: the scaling table of runs logged earlier."""

import argparse
import json
import os
import sys

from keras_scaling.cli import _plot, _speedup_table
from keras_scaling.cli._errors import UsageError

_DESCRIPTION = """\
Read every throughput.json under LOGDIR (recursively), as ThroughputLogger
writes them at the end of training, print the scaling table and write the
plot of speedup against replicas (with matplotlib: pip install
'keras-scaling[plot]'). Speedup is over the 1-replica run when there is
exactly one, otherwise over each run's own recorded baseline.
"""


def add_parser(subparsers):
    """Registers the `report` subcommand on an argparse `subparsers` object."""
    parser = subparsers.add_parser(
        "report",
        help="print the scaling table of earlier runs and write its plot",
        description=_DESCRIPTION,
        epilog="example:\n  keras-scaling report logs/bench-20260101-120000\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("logdir", metavar="LOGDIR", help="directory to search")
    parser.add_argument(
        "--output", metavar="PNG", help="where to write the plot (default: LOGDIR/scaling.png)"
    )
    parser.set_defaults(run=run)
    return parser


def run(args):
    """Prints the table of the runs under `args.logdir`; returns the exit status."""
    log_dir = os.path.abspath(args.logdir)
    if not os.path.isdir(log_dir):
        raise UsageError(f"LOGDIR {args.logdir!r} is not a directory")
    runs, problems = _speedup_table.find_runs(log_dir)
    for problem in problems:
        print(f"keras-scaling report: skipped {problem}", file=sys.stderr)
    if not runs:
        raise UsageError(
            f"no readable throughput.json under {args.logdir!r}; ThroughputLogger "
            "writes one into its log_dir at the end of training"
        )
    summary = _speedup_table.summarize(runs)
    print(_speedup_table.summary_text(summary))
    output = args.output or os.path.join(log_dir, "scaling.png")
    title = f"runs under {os.path.basename(log_dir)}"
    try:  # a bench's own title
        with open(os.path.join(log_dir, "scaling.json"), encoding="utf-8") as file:
            title = json.load(file).get("title") or title
    except (OSError, ValueError, AttributeError):
        pass
    try:
        png = _plot.scaling_plot_png(summary.rows, title)
    except _plot.MatplotlibMissing as error:
        print(f"\nNo chart ({output}): {error}.")
        return 0
    try:
        with open(output, "wb") as file:
            file.write(png)
    except OSError as error:
        raise UsageError(f"cannot write the plot to {output!r} ({error.strerror})") from None
    print(f"Wrote {output}.")
    return 0
