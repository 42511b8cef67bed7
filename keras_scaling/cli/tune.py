"""`keras-scaling tune`: the fastest settings for a model on its devices, by measurement.

The command checks its arguments, then runs the search in a process of its
own (`keras_scaling.cli._tune_worker`): TensorFlow fixes the number of
logical CPUs and its thread pools once per process.
"""

import argparse
import os
import subprocess
import sys
import time

from keras_scaling.cli import _bench_worker, _models
from keras_scaling.cli._arguments import positive_int, positive_number
from keras_scaling.cli._errors import UsageError

_DEFAULT_PER_REPLICA_BATCH = 64
_DEFAULT_BUDGET_S = 180.0
_ALLOWABLE = ("batch", "precision")
# The worker's last stderr line on bad input starts with this.
USAGE_PREFIX = "keras-scaling tune: error: "
_WORKER_LOG = "tune_worker.log"
_LOG_TAIL_LINES = 25

_DESCRIPTION = """\
Find the fastest settings for training a model on this machine's devices,
by measurement, and write them where one line applies them.

Starts from the model's settings (--steps-per-execution, the bench's thread
pools on logical CPUs), splits the step with keras_scaling.explain and tries
the remedy of what bounds it first. Each knob's value trains in alternating
rounds with the incumbent (real model.fit calls, timed over their second
epoch); a change is kept only when its median gain exceeds the rounds'
noise. It stops when --budget seconds are spent.

Knobs that keep the model's arithmetic, tried by default:
  steps_per_execution   the same weights, bitwise
  jit_compile           XLA: other kernels, the same mathematics up to float
                        rounding (not with several replicas on CPUs)
  cache                 the input pipeline's cache (--data pipelines; arrays
                        are in memory already)
Knobs that change training, tried only with --allow:
  batch                 the per-replica batch: scale the learning rate
  precision             mixed precision (GPUs and TPUs)

Prints the table of every knob tried (samples/sec median and spread, ratio
to the incumbent and to the start, kept or not and why), writes
LOGDIR/tune.json and the table into TensorBoard (run "tune", Text tab).
Apply the result with:

  tuned = keras_scaling.tune.load("LOGDIR/tune.json")
  model.compile(..., **tuned.compile_kwargs)
  train = keras_scaling.data.distribute(data, strategy=strategy, **tuned.data_kwargs)

--model and --data are as for keras-scaling bench: a preset (mlp, cnn,
resnet50) or package.module:function.
"""

_EXAMPLE = """\
examples:
  keras-scaling tune --cpu-devices 2 --model mlp --per-replica-batch 128
  keras-scaling tune --model my.models:build --data my.data:load --budget 600
  keras-scaling tune --cpu-devices 2 --model cnn --allow batch --logdir logs/tune
"""


def add_parser(subparsers):
    """Registers the `tune` subcommand on an argparse `subparsers` object."""
    parser = subparsers.add_parser(
        "tune",
        help="find the fastest settings for a model by measurement",
        description=_DESCRIPTION,
        epilog=_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        default="mlp",
        metavar="PRESET|package.module:function",
        help=f"the model: {', '.join(_models.PRESETS)} or package.module:function (default: mlp)",
    )
    parser.add_argument(
        "--data",
        metavar="package.module:function",
        help="your data instead of synthetic data: a function returning a dataset of "
        "samples, arrays (x, y) or a PyDataset",
    )
    parser.add_argument(
        "--cpu-devices",
        type=positive_int,
        metavar="N",
        help="train on N logical CPUs instead of the GPUs",
    )
    parser.add_argument(
        "--per-replica-batch",
        type=positive_int,
        default=_DEFAULT_PER_REPLICA_BATCH,
        metavar="B",
        help=f"each replica's batch at the start (default {_DEFAULT_PER_REPLICA_BATCH})",
    )
    parser.add_argument(
        "--steps-per-execution",
        type=positive_int,
        default=1,
        metavar="K",
        help="the start's steps per compiled call, for models tune compiles (default 1)",
    )
    parser.add_argument(
        "--budget",
        type=positive_number("seconds"),
        default=_DEFAULT_BUDGET_S,
        metavar="SECONDS",
        help=f"seconds for the whole search (default {_DEFAULT_BUDGET_S:g})",
    )
    parser.add_argument(
        "--allow",
        default="",
        metavar="KNOB[,KNOB]",
        help="knobs that change training, tried only when named: batch, precision",
    )
    parser.add_argument(
        "--logdir",
        "--log-dir",
        dest="logdir",
        metavar="LOGDIR",
        help="where to write tune.json and the TensorBoard run (default: logs/tune-YYYYmmdd-HHMMSS)",
    )
    parser.set_defaults(run=run)
    return parser


def _check(args):
    """Raises `UsageError` for bad arguments, before any process starts."""
    _models.check_spec(args.model)
    if args.data is not None:
        _models.check_data_spec(args.data)
    for name in filter(None, (part.strip() for part in args.allow.split(","))):
        if name not in _ALLOWABLE:
            raise UsageError(
                f"--allow {args.allow!r}: unknown knob {name!r}; the knobs that change "
                f"training are {', '.join(_ALLOWABLE)} (the others are tried without asking)"
            )
    from keras_scaling.tune import _search

    if args.budget < _search.MIN_BUDGET_S:
        raise UsageError(
            f"--budget {args.budget:g} is too small to measure one candidate against the "
            f"start; pass --budget {_search.MIN_BUDGET_S:g} or more"
        )


def run(args):
    """Checks the arguments, runs the search in a worker process; returns the exit status."""
    _check(args)
    log_dir = args.logdir or os.path.join("logs", time.strftime("tune-%Y%m%d-%H%M%S"))
    log_dir = os.path.abspath(log_dir)
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        raise UsageError(f"--logdir {log_dir!r} is a file; pass a directory")
    command = [
        sys.executable,
        "-m",
        "keras_scaling.cli._tune_worker",
        f"--model={args.model}",
        f"--per-replica-batch={args.per_replica_batch}",
        f"--steps-per-execution={args.steps_per_execution}",
        f"--budget={args.budget}",
        f"--allow={args.allow}",
        f"--logdir={log_dir}",
    ]
    if args.data is not None:
        command.append(f"--data={args.data}")
    if args.cpu_devices:
        command.append(f"--cpu-devices={args.cpu_devices}")
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.cpu_devices:
        env.setdefault(_bench_worker.THREADPOOL_ENV, "1")
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, _WORKER_LOG)
    sys.stdout.flush()
    # The worker's stdout (the trials, the table) goes to the terminal; its
    # stderr (TensorFlow's start-up lines) to a log, shown when it fails.
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(
            command, stdout=None, stderr=log, stdin=subprocess.DEVNULL, env=env, text=True
        )
        try:
            returncode = process.wait()
        except BaseException:
            if process.poll() is None:
                process.terminate()
                process.wait()
            raise
    with open(log_path, encoding="utf-8", errors="replace") as log:
        lines = [line.rstrip("\n") for line in log.readlines()[-_LOG_TAIL_LINES:]]
    usage = [line[len(USAGE_PREFIX) :] for line in lines if line.startswith(USAGE_PREFIX)]
    if returncode == 2 and usage:
        raise UsageError(usage[-1])
    if returncode != 0:
        print(
            f"keras-scaling tune: the search failed with exit status {returncode}. "
            f"Last lines of {log_path}:\n" + "\n".join(f"  {line}" for line in lines),
            file=sys.stderr,
        )
    return returncode
