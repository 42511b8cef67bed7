"""`keras-scaling doctor`: check the cluster this worker belongs to, as training will use it."""

import argparse
import faulthandler
import math
import os
import sys
import threading

from keras_scaling.cli._arguments import number, positive_int
from keras_scaling.launch._environment import CPU_DEVICES_ENV

# keras_scaling.doctor._checks.RESNET50_GRADIENT_MB, written out so that
# `keras-scaling --help` does not import TensorFlow.
_DEFAULT_SIZE_MB = 102.2
_DEFAULT_TIMEOUT_S = 600.0
_FALLBACK_DELAY_S = 5.0
# Python's timers overflow near 9e9 s; a week is more than any check needs.
_MAX_TIMEOUT_S = 7 * 24 * 3600

_DESCRIPTION = """\
Check the cluster this process belongs to, the way training will use it: run
it on every worker as training runs (under keras-scaling launch, srun, Ray, or
alone). Checks versions, devices, an all-reduce of known values, the time to
the first collective, the all-reduce bandwidth and who can reach the job's
servers (the doctor guide says what each means). Exit status 0 when every
check passed, 1 when one failed or they did not finish within --timeout.
"""


def add_parser(subparsers):
    """Registers the `doctor` subcommand on an argparse `subparsers` object."""
    parser = subparsers.add_parser(
        "doctor",
        help="check versions, collectives and bandwidth on every worker of a cluster",
        usage="%(prog)s [--cpu-devices K] [--size-mb MB] [--rounds N] [--timeout SECONDS]",
        description=_DESCRIPTION,
        epilog="examples:\n  keras-scaling doctor --cpu-devices 2 --size-mb 10\n"
        "  keras-scaling launch --workers 2 -- keras-scaling doctor\n"
        "  srun --ntasks 2 keras-scaling doctor\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    try:
        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e6
    except (AttributeError, OSError, ValueError):  # the system does not say
        memory_mb = math.inf
    add = parser.add_argument
    cpus_help = f"split this worker's CPU into K logical devices ({CPU_DEVICES_ENV}=K)"
    add("--cpu-devices", type=positive_int, metavar="K", help=cpus_help)
    size_mb = number("MB", high=memory_mb, high_text=f"{memory_mb:,.0f} (this machine's memory)")
    size_help = (
        f"MB (10^6 bytes) of the float32 tensor whose all-reduce is timed; default "
        f"{_DEFAULT_SIZE_MB}, ResNet50's gradients. No MB/s under 1 MB or 1 ms: too small to time"
    )
    add("--size-mb", type=size_mb, default=_DEFAULT_SIZE_MB, metavar="MB", help=size_help)
    rounds_help = "timed all-reduces, the median is shown; default 3"
    add("--rounds", type=positive_int, default=3, metavar="N", help=rounds_help)
    seconds = number("seconds", high=_MAX_TIMEOUT_S, high_text=f"{_MAX_TIMEOUT_S} (a week)")
    timeout_help = f"give up with exit status 1 after SECONDS; default {_DEFAULT_TIMEOUT_S:g}"
    add("--timeout", type=seconds, default=_DEFAULT_TIMEOUT_S, metavar="SECONDS", help=timeout_help)
    parser.set_defaults(run=run)
    return parser


def _give_up(timeout_s):
    print(
        f"keras-scaling doctor: FAILED: the checks did not finish within {timeout_s:g} s; the "
        "last line above says how far they got (no check printed: a worker was not started or "
        "cannot reach the others at TF_CONFIG's addresses). Start doctor on every worker, or "
        "give more time with --timeout.",
        flush=True,
    )
    sys.stderr.flush()
    # TensorFlow's wait for the other workers cannot be interrupted, and it
    # catches SIGTERM: only leaving the process ends it.
    os._exit(1)


def run(args):
    """Runs the checks on this worker; returns 0 when all passed, else 1."""
    if args.cpu_devices:
        os.environ[CPU_DEVICES_ENV] = str(args.cpu_devices)
    watchdog = threading.Timer(args.timeout, _give_up, args=(args.timeout,))
    watchdog.daemon = True
    watchdog.start()
    # TensorFlow can wait for the other workers holding the interpreter's
    # lock, so that the thread above never runs: faulthandler's own thread
    # needs no lock. It prints where each thread waits and exits with 1.
    faulthandler.dump_traceback_later(args.timeout + _FALLBACK_DELAY_S, exit=True)
    try:
        from keras_scaling import doctor  # TensorFlow loads only when a check runs

        report = doctor.run_checks(size_mb=args.size_mb, rounds=args.rounds)
    finally:
        faulthandler.cancel_dump_traceback_later()
        watchdog.cancel()
    return 0 if report.ok else 1
