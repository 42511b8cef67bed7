"""`keras-scaling doctor`: check the cluster this worker belongs to, as training will use it."""

import argparse
import faulthandler
import math
import os
import sys
import threading

from keras_scaling.cli._arguments import positive_int
from keras_scaling.launch._environment import CPU_DEVICES_ENV

# ResNet50's gradients: keras_scaling.doctor._checks.RESNET50_GRADIENT_MB,
# written out so that `keras-scaling --help` does not import TensorFlow.
_DEFAULT_SIZE_MB = 102.2
_DEFAULT_TIMEOUT_S = 600.0
_FALLBACK_DELAY_S = 5.0
# Python's timers overflow near 9e9 s; a week is more than any check needs.
_MAX_TIMEOUT_S = 7 * 24 * 3600

_DESCRIPTION = """\
Check the cluster this process belongs to, the way training will use it.

Run it on every worker as training runs: under keras-scaling launch, under
srun, in a Ray Train loop (keras_scaling.doctor.run_checks()), or alone. Each
worker prints where its cluster came from (TF_CONFIG), its strategy, workers,
replicas and devices, then checks (versions and devices from reports the
workers exchange before any collective, the rest through the strategy's
collectives):

  versions          every worker runs the same Python, TensorFlow, Keras and
                    keras_scaling (a worker that differs is named)
  devices           every worker has as many replicas, on the same kind of
                    device (each worker's devices are named); when they
                    differ, the collectives below are not run
  all-reduce        a sum of known values over all replicas gives the known sum
  first collective  seconds from the start until the first collective completed
  bandwidth         all-reduce time and MB/s of a float32 tensor of --size-mb
                    (default: ResNet50's gradients, 102.2 MB); no MB/s with one
                    replica (nothing to combine), nor under 1 MB or 1 ms (too
                    small to time)
  server            who can reach the job's TensorFlow servers: they listen on
                    every interface and authenticate nobody

The exit status is 0 when every check passed, 1 when one failed or the
checks did not finish within --timeout seconds: a worker that was not
started, or cannot reach the others, makes the rest wait forever in
TensorFlow. Then a message says so or, when TensorFlow holds the interpreter
while it waits (building the strategy), 5 s later Python prints where each
thread waited ("Timeout (0:10:05)!").
"""

_EXAMPLE = """\
examples:
  keras-scaling doctor --cpu-devices 2 --size-mb 10
  keras-scaling launch --workers 2 -- keras-scaling doctor
  srun --ntasks 2 keras-scaling doctor
"""


def _number_up_to(unit, maximum, maximum_text):
    """An argparse `type`: a number above 0 and at most `maximum`, or a message naming what was given."""

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        # Also refuses nan and inf: no comparison holds for nan, inf is above any maximum.
        if not 0 < value <= maximum:
            raise argparse.ArgumentTypeError(
                f"must be a number of {unit} above 0 and at most {maximum_text}, got {text!r}"
            )
        return value

    return parse


def _memory_mb():
    """This machine's memory in MB, or inf when the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e6
    except (AttributeError, OSError, ValueError):
        return math.inf


def add_parser(subparsers):
    """Registers the `doctor` subcommand on an argparse `subparsers` object."""
    parser = subparsers.add_parser(
        "doctor",
        help="check versions, collectives and bandwidth on every worker of a cluster",
        usage="%(prog)s [--cpu-devices K] [--size-mb MB] [--rounds N] [--timeout SECONDS]",
        description=_DESCRIPTION,
        epilog=_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--cpu-devices",
        type=positive_int,
        default=None,
        metavar="K",
        help=f"split this worker's CPU into K logical devices (sets {CPU_DEVICES_ENV}=K, "
        "as keras-scaling launch --cpu-devices does)",
    )
    memory_mb = _memory_mb()
    parser.add_argument(
        "--size-mb",
        type=_number_up_to("MB", memory_mb, f"{memory_mb:,.0f} (this machine's memory)"),
        default=_DEFAULT_SIZE_MB,
        metavar="MB",
        help=f"size of the float32 tensor whose all-reduce is timed, in MB (10^6 bytes), "
        f"above 0 and at most this machine's memory; default {_DEFAULT_SIZE_MB}, ResNet50's "
        "gradients. Under 1 MB, or when the median round takes under 1 ms, the time is "
        "shown but no MB/s: too small to time",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=3,
        metavar="N",
        help="timed all-reduces of that tensor, the median is shown; default 3",
    )
    parser.add_argument(
        "--timeout",
        type=_number_up_to("seconds", _MAX_TIMEOUT_S, f"{_MAX_TIMEOUT_S} (a week)"),
        default=_DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up, with exit status 1, when the checks have not finished after "
        f"SECONDS, above 0 and at most {_MAX_TIMEOUT_S} (a week); default "
        f"{_DEFAULT_TIMEOUT_S:g}",
    )
    parser.set_defaults(run=run)
    return parser


def _give_up(timeout_s):
    print(
        f"keras-scaling doctor: FAILED: the checks did not finish within {timeout_s:g} s. "
        "Above, the last line printed says how far they got: with no check printed, "
        "this worker is still waiting for the others to join or to send their reports (a "
        "worker was not started, or cannot reach the others at the addresses and ports "
        "of TF_CONFIG). Start doctor on every worker of the cluster, as training is "
        "started, or give more time with --timeout.",
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
        # Imported here: TensorFlow loads only when a check runs.
        from keras_scaling import doctor

        report = doctor.run_checks(size_mb=args.size_mb, rounds=args.rounds)
    finally:
        faulthandler.cancel_dump_traceback_later()
        watchdog.cancel()
    return 0 if report.ok else 1
