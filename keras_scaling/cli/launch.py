"""`keras-scaling launch`: run a training command as N local workers of one cluster."""

import argparse
import sys

from keras_scaling.cli._arguments import non_negative_int, positive_int
from keras_scaling.launch import _isolation, launcher

_DESCRIPTION = """\
Run COMMAND as N local workers of one MultiWorkerMirroredStrategy cluster.

Each worker gets a TF_CONFIG naming all workers on free 127.0.0.1 ports
(worker 0 is the chief), so keras_scaling.auto_strategy() in COMMAND joins
them. Every output line is prefixed with "[worker i]". When a worker fails,
the others are stopped and the exit status is the failed worker's (128 + N
when signal N killed it); Ctrl-C is forwarded to every worker. SIGTERM is
passed to every worker as a preemption notice (keras_scaling.BackupAndRestore
saves, then exits with status 75), SIGKILL follows after --grace-period.
--max-restarts N starts the whole job again after a worker fails or is
preempted, up to N times, and says why. No worker process is left running
when launch returns.

TensorFlow's servers listen on every network interface and authenticate
nobody, so on Linux all workers run in one private network namespace with
only loopback (--isolation=auto, when the kernel allows it): nothing outside
can reach them, and they reach no network but 127.0.0.1.
"""

_EXAMPLE = """\
example:
  keras-scaling launch --workers 2 --cpu-devices 2 -- python examples/multi_worker.py
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
        epilog=_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        required=True,
        metavar="N",
        help="number of worker processes",
    )
    parser.add_argument(
        "--cpu-devices",
        type=positive_int,
        default=None,
        metavar="K",
        help="split each worker's CPU into K logical devices (sets "
        f"{launcher.CPU_DEVICES_ENV}=K, read by keras_scaling.auto_strategy)",
    )
    parser.add_argument(
        "--port-base",
        type=positive_int,
        default=None,
        metavar="P",
        help="use ports P, P+1, ... on 127.0.0.1 (default: free ports)",
    )
    parser.add_argument(
        "--grace-period",
        type=_seconds,
        default=5.0,
        metavar="SECONDS",
        help="time a worker has to stop after each signal before a stronger "
        "one (SIGINT, then SIGTERM, then SIGKILL); default 5",
    )
    parser.add_argument(
        "--max-restarts",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="restart the whole job after a worker fails or is preempted "
        "(exit status 75), up to N times; default 0",
    )
    parser.add_argument(
        "--isolation",
        choices=_isolation.MODES,
        default="auto",
        help="run the workers in a private network namespace with only "
        "loopback: 'auto' (default) when the kernel allows it, else warn and "
        "go on; 'require' refuses to start without it; 'off' leaves the "
        "workers' ports open on every interface (to attach a debugger)",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the program each worker runs, with its arguments",
    )
    parser.set_defaults(run=run)
    return parser


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


def run(args):
    """Runs `args.command` as `args.workers` workers; returns the exit status."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
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
