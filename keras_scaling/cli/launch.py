"""`keras-scaling launch`: run a training command as N local workers of one cluster."""

import argparse
import sys

from keras_scaling.cli._arguments import non_negative_int, number, positive_int
from keras_scaling.launch import _isolation, launcher

_DESCRIPTION = """\
Run COMMAND as N local workers of one MultiWorkerMirroredStrategy cluster:
each gets a TF_CONFIG naming all workers on 127.0.0.1, so
keras_scaling.auto_strategy() joins them. Output lines are prefixed with
"[worker i]"; when a worker fails the others are stopped and its exit status
is returned. The multi-worker guide says how signals, restarts and the
network isolation work.
"""


def add_parser(subparsers):
    """Registers the `launch` subcommand on an argparse `subparsers` object."""
    parser = subparsers.add_parser(
        "launch",
        help="run a training command as N local workers (TF_CONFIG set for each)",
        usage="%(prog)s --workers N [--cpu-devices K] [--port-base P] "
        "[--grace-period SECONDS] [--max-restarts N] "
        "[--isolation {auto,require,off}] -- COMMAND ...",
        description=_DESCRIPTION,
        epilog="example:\n  keras-scaling launch --workers 2 --cpu-devices 2 -- "
        "python examples/multi_worker.py\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--workers", type=positive_int, required=True, metavar="N", help="worker processes")
    cpus_help = f"split each worker's CPU into K logical devices ({launcher.CPU_DEVICES_ENV}=K)"
    add("--cpu-devices", type=positive_int, metavar="K", help=cpus_help)
    add("--port-base", type=positive_int, metavar="P", help="ports P, P+1, ... (default: free)")
    seconds = number("seconds", low_included=True)
    grace_help = "time a worker has after SIGINT, then SIGTERM, before the next; default 5"
    add("--grace-period", type=seconds, default=5.0, metavar="SECONDS", help=grace_help)
    restarts_help = "restart the job after a worker fails or is preempted, up to N times; default 0"
    add("--max-restarts", type=non_negative_int, default=0, metavar="N", help=restarts_help)
    isolation_help = (
        "run the workers in a network namespace with only loopback: 'auto' (default) when the "
        "kernel allows it, 'require' or refuse to start, 'off' (to attach a debugger)"
    )
    add("--isolation", choices=_isolation.MODES, default="auto", help=isolation_help)
    add("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="what each worker runs")
    parser.set_defaults(run=run)
    return parser


def run(args):
    """Runs `args.command` as `args.workers` workers; returns the exit status."""
    command = args.command[1:] if args.command[:1] == ["--"] else list(args.command)
    if not command:
        print(
            "keras-scaling launch: no command given; write it after '--', e.g. "
            "keras-scaling launch --workers 2 -- python train.py",
            file=sys.stderr,
        )
        return 2
    try:
        result = launcher.launch(
            command,
            num_workers=args.workers,
            cpu_devices=args.cpu_devices,
            port_base=args.port_base,
            grace_period_s=args.grace_period,
            max_restarts=args.max_restarts,
            isolation=args.isolation,
        )
    except (TypeError, ValueError) as error:
        print(f"keras-scaling launch: {error}", file=sys.stderr)
        return 2
    if result.message:
        print(f"keras-scaling launch: {result.message}", file=sys.stderr)
    return result.exit_code
