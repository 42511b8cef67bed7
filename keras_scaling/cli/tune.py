"""`keras-scaling tune`: the fastest settings for a model on its devices, by measurement.

The command checks its arguments, then runs the search in a process of its
own (`keras_scaling.cli._tune_worker`): TensorFlow fixes the number of
logical CPUs and its thread pools once per process. On several devices of
one machine, that process then serves rounds while another process, with
another all-reduce, runs in turns with it: a strategy's all-reduce is fixed
when it is made, and two MirroredStrategy objects in one process break each
other's.
"""

import argparse
import json
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
# The worker's lines when it serves rounds (`keras_scaling.cli._tune_worker`).
READY = "@ready"
RATE = "@rate "
QUIT = "quit"
_WORKER_LOG = "tune_worker.log"
# Share of the budget kept for the all-reduce, measured in processes of its own.
_PROCESS_SHARE = 0.3
# From this budget on, 40%: a candidate process's start, warm-up, rounds and
# the final side by side across processes need about 70 s on 2 cores.
_PROCESS_SHARE_LARGE = 0.4
_LARGE_BUDGET_S = 120.0
# The smallest budget that also measures the all-reduce.
_ALL_REDUCE_MIN_BUDGET_S = 60.0
# Seconds a worker gets to end after it is told to, and then to be killed.
_END_S = 5.0
_LOG_TAIL_LINES = 25

_DESCRIPTION = """\
Find the fastest settings for training a model on this machine's devices,
by measurement, and write them where one line applies them.

Starts from the model's settings (--steps-per-execution, the bench's thread
pools on logical CPUs), splits the step with keras_scaling.explain (when it
fits in 30% of the budget) and tries the remedy of what bounds it
first. Each knob's value trains in alternating rounds with the incumbent
(real model.fit calls, timed over their epochs after the first); a change
is kept only when its median gain exceeds the rounds' noise and 5%. At the
end the best and the start run side by side, in budget kept back for it:
unless that gain exceeds the noise too, the start is handed back. It stops
when --budget seconds are spent.

Knobs that keep the model's arithmetic, tried by default:
  steps_per_execution   the same weights, bitwise
  jit_compile           XLA: other kernels, the same mathematics up to float
                        rounding (not with several replicas on CPUs)
  cache                 the input pipeline's cache (--data pipelines; arrays
                        are in memory already)
  private_threadpool_size
                        tf.data's threads: a pool of the pipeline's own
                        (map parallelism and prefetch are AUTOTUNE already)
  cross_device_ops      the all-reduce, on several devices of one machine:
                        each in a process of its own, in turns with the
                        first's (30% of the budget, 40% from --budget
                        120 on; from --budget 60 on);
                        across workers nothing is measured
Knobs that change training, tried only with --allow:
  batch                 the per-replica batch: scale the learning rate
  precision             mixed precision (GPUs and TPUs)

Prints the table of every knob tried (samples/sec median and spread, ratio
to the incumbent and to the start, kept or not and why), writes
LOGDIR/tune.json and the table into TensorBoard (run "tune", Text tab).
Apply the result with:

  tuned = keras_scaling.tune.load("LOGDIR/tune.json")
  strategy = keras_scaling.auto_strategy(**tuned.strategy_kwargs)
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


class _Worker:
    """A `_tune_worker` process: its output to the terminal until it is ready, then rounds on request."""

    def __init__(self, args, log_dir, started_at, *, name, extra):
        self.serves = "--serve" in extra
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
            f"--started-at={started_at}",
            *extra,
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
        self.log_path = os.path.join(log_dir, name)
        # Its stderr (TensorFlow's start-up lines) goes to a log, shown when it fails.
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 (closed in finish)
        sys.stdout.flush()
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.PIPE,
            env=env,
            text=True,
        )

    def _lines(self, echo):
        assert self.process.stdout is not None  # a pipe
        for line in self.process.stdout:
            if line.startswith(RATE) or line.strip() == READY:
                yield line.strip()
            elif line.startswith("| knob") and self.serves:
                # The table and the outcome come once, from here, when the
                # all-reduce has been measured too.
                echo = False
            elif echo:
                sys.stdout.write(line)
                sys.stdout.flush()

    def wait_ready(self, echo):
        """True once the worker serves rounds; False when it ended first."""
        return next(self._lines(echo), None) == READY

    def round(self, settings, steps):
        """One round of `settings` in this process: (samples/sec, wall seconds)."""
        assert self.process.stdin is not None  # a pipe
        self.process.stdin.write(json.dumps({"settings": settings, "steps": steps}) + "\n")
        self.process.stdin.flush()
        line = next(self._lines(echo=False), None)
        if line is None:
            raise RuntimeError(f"the worker ended; see {self.log_path}")
        rate, wall_s = line[len(RATE) :].split()
        return float(rate), float(wall_s)

    def finish(self):
        """Ends the worker; returns its exit status."""
        if self.process.poll() is None and self.process.stdin is not None:
            try:
                self.process.stdin.write(QUIT + "\n")
                self.process.stdin.close()
            except OSError:  # it ended meanwhile
                pass
        try:
            returncode = self.process.wait(timeout=_END_S)
        except subprocess.TimeoutExpired:
            # Its work is done; TensorFlow's teardown is not worth waiting for.
            self.process.kill()
            returncode = self.process.wait()
        self._log.close()
        return returncode

    def kill(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait()
        self._log.close()

    def failure(self, returncode):
        """Raises `UsageError` for bad input; otherwise prints the log's tail and returns the status."""
        with open(self.log_path, encoding="utf-8", errors="replace") as log:
            lines = [line.rstrip("\n") for line in log.readlines()[-_LOG_TAIL_LINES:]]
        usage = [line[len(USAGE_PREFIX) :] for line in lines if line.startswith(USAGE_PREFIX)]
        if returncode == 2 and usage:
            raise UsageError(usage[-1])
        print(
            f"keras-scaling tune: the search failed with exit status {returncode}. "
            f"Last lines of {self.log_path}:\n" + "\n".join(f"  {line}" for line in lines),
            file=sys.stderr,
        )
        return returncode or 1


def _devices(cpu_devices):
    """`(device kind, replicas)` the worker will train on."""
    if cpu_devices:
        return "CPU", cpu_devices
    import tensorflow as tf

    gpus = len(tf.config.list_physical_devices("GPU"))
    return ("GPU", gpus) if gpus else ("CPU", 1)


def run(args):
    """Checks the arguments, runs the search in worker processes; returns the exit status."""
    from keras_scaling.tune import _candidates

    _check(args)
    started_at = time.time()
    log_dir = args.logdir or os.path.join("logs", time.strftime("tune-%Y%m%d-%H%M%S"))
    log_dir = os.path.abspath(log_dir)
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        raise UsageError(f"--logdir {log_dir!r} is a file; pass a directory")
    device_kind, replicas = _devices(args.cpu_devices)
    values, reason = _candidates.all_reduce_values(device_kind, replicas, 1)
    if values and args.budget < _ALL_REDUCE_MIN_BUDGET_S:
        # Its share would leave the first search too little to measure anything.
        values = ()
        reason = f"--budget {args.budget:g} leaves it no time; pass --budget 60 or more"
    # Kept back from the search in the first process: the all-reduce's share,
    # and the seconds its processes take to end.
    share = _PROCESS_SHARE_LARGE if args.budget >= _LARGE_BUDGET_S else _PROCESS_SHARE
    reserve_s = (share * args.budget if values else 0.0) + _END_S
    extra = [f"--reserve={reserve_s}"] + (["--serve"] if values else [])
    worker = _Worker(args, log_dir, started_at, name=_WORKER_LOG, extra=extra)
    try:
        ready = worker.wait_ready(echo=True)
        path = os.path.join(log_dir, "tune.json")
        if not ready:
            returncode = worker.finish()
            if returncode:
                return worker.failure(returncode)
            _finish_record(path, args, started_at, reason)
            return 0
        ready_s = time.time() - started_at
        with open(path, encoding="utf-8") as file:
            record = json.load(file)
        worker = _search_all_reduce(
            args, record, worker, values, started_at, ready_s, log_dir, device_kind
        )
    except BaseException:
        worker.kill()
        raise
    worker.finish()
    from keras_scaling.tune import _report

    record["elapsed_s"] = time.time() - started_at
    record["budget_s"] = args.budget
    _report.write(log_dir, record)
    print("\n" + _report.format_table(record["trials"]) + "\n")
    print("\n".join(_report.summary_lines(record)))
    print("\nApply it:")
    print("\n".join(f"  {line}" for line in _report.apply_lines(record, path)))
    return 0


def _finish_record(path, args, started_at, reason):
    """The first process's tune.json, with the whole command's time and why the all-reduce was not tried."""
    from keras_scaling.tune import _report, _search

    with open(path, encoding="utf-8") as file:
        record = json.load(file)
    record["elapsed_s"] = time.time() - started_at
    record["budget_s"] = args.budget
    if reason:
        record["trials"].append(
            _search.trial_record("cross_device_ops", None, reason=f"not tried: {reason}")
        )
    _report.write(os.path.dirname(path), record)


def _search_all_reduce(args, record, worker, values, started_at, ready_s, log_dir, device_kind):
    """Each all-reduce against the incumbent's, in a process of its own; returns the incumbent worker."""
    from keras_scaling.tune import _candidates, _decision, _search

    best = record["best"]
    settings = best["settings"]
    global_batch = args.per_replica_batch * record["replicas"]
    if settings["data"].get("per_replica_batch_size"):
        global_batch = settings["data"]["per_replica_batch_size"] * record["replicas"]
    step_s = global_batch / best["samples_per_sec"]
    spe = int(settings["compile"].get("steps_per_execution", 1))
    steps = _decision.steps_per_round(step_s, _search.round_s_for(args.budget), spe)
    # What starting a worker costs: its time to the first round, tune's own search aside.
    start_up_s = max(1.0, ready_s - record["elapsed_s"])
    warm_up_s = record.get("timeline_s", {}).get("warm_up_s", 0.0)
    record["notes"].append(
        f"all-reduce: TensorFlow's choice on {device_kind} is "
        f"{_candidates.default_all_reduce(device_kind)}; each other one ran in a process "
        "of its own, in turns with it"
    )
    # The serving runner traces its train function again: its first round
    # is a warm-up; the second gives the cost of a round.
    worker.round(settings, steps)
    _, pair_s = worker.round(settings, steps)
    pair_s *= 2
    first, first_best = worker, dict(best)
    # The start runs at 1/ratio of the best's speed in the final side by side.
    confirm_pair_s = pair_s / 2 * (1 + max(1.0, best["ratio_to_start"]))
    confirm_reserve_s = 1.5 * _decision.MIN_ROUNDS * confirm_pair_s
    for value in values:
        left_s = args.budget - (time.time() - started_at)
        # Another process may start slower than the first; its tracing is
        # as the first's warm-up; ending the processes takes a few seconds.
        overhead_s = 1.5 * start_up_s + warm_up_s + _END_S
        rounds = _decision.rounds_affordable(
            left_s, pair_s, overhead_s, reserve_s=confirm_reserve_s
        )
        if rounds == 0:
            record["trials"].append(
                _search.trial_record(
                    "cross_device_ops", value, reason="not measured: the budget is spent"
                )
            )
            break
        candidate_settings = _candidates.with_value(settings, "cross_device_ops", value)
        candidate = _Worker(
            args,
            log_dir,
            started_at,
            name=f"tune_worker_{value}.log",
            extra=[
                "--serve-only",
                f"--strategy-kwargs={json.dumps(candidate_settings['strategy'])}",
            ],
        )
        try:
            if not candidate.wait_ready(echo=False):
                raise RuntimeError(f"it ended before its first round; see {candidate.log_path}")
            candidate.round(candidate_settings, steps)  # traces
            incumbent_rates: list[float] = []
            candidate_rates: list[float] = []
            for index in range(rounds):
                left_s = args.budget - (time.time() - started_at)
                if index and left_s < pair_s + _END_S + confirm_reserve_s:
                    break
                if index and _decision.is_clear(
                    _decision.Comparison(tuple(incumbent_rates), tuple(candidate_rates))
                ):
                    break
                pair_started_s = time.time()
                pair = [
                    (worker, settings, incumbent_rates),
                    (candidate, candidate_settings, candidate_rates),
                ]
                for process, these, rates in pair if index % 2 == 0 else reversed(pair):
                    rates.append(process.round(these, steps)[0])
                pair_s = max(pair_s, time.time() - pair_started_s)
        except (RuntimeError, OSError, ValueError) as error:
            candidate.kill()
            record["trials"].append(
                _search.trial_record("cross_device_ops", value, reason=f"failed: {error}")
            )
            continue
        if len(incumbent_rates) < _decision.MIN_ROUNDS:
            candidate.finish()
            record["trials"].append(
                _search.trial_record(
                    "cross_device_ops", value, reason="not measured: the budget is spent"
                )
            )
            break
        comparison = _decision.Comparison(tuple(incumbent_rates), tuple(candidate_rates))
        decision = _decision.decide(comparison)
        ratio_to_start = best["ratio_to_start"] * comparison.ratio
        trial = _search.trial_record(
            "cross_device_ops",
            value,
            comparison=comparison,
            decision=decision,
            ratio_to_start=ratio_to_start,
        )
        record["trials"].append(trial)
        print(
            f"  cross_device_ops={value}: {comparison.candidate_median:,.0f} samples/sec, "
            f"{comparison.ratio:.2f}x the incumbent: "
            f"{'kept' if decision.kept else 'not kept'} ({decision.reason})",
            flush=True,
        )
        if decision.kept:
            if worker is not first:  # the first serves the start's rounds at the end
                worker.finish()
            worker, settings = candidate, candidate_settings
            best["settings"] = settings
            best["ratio_to_start"] = ratio_to_start
            best["samples_per_sec"] = record["start"]["samples_per_sec"] * ratio_to_start
            best["ratio_source"] = (
                "the product of the kept changes' ratios; the all-reduce in processes of its own"
            )
        else:
            candidate.finish()
    if worker is not first:
        worker = _confirm_all_reduce(args, record, first, first_best, worker, steps, started_at)
    return worker


def _confirm_all_reduce(args, record, first, first_best, worker, steps, started_at):
    """The start (in the first process) against the best (in its own), side by side; returns the worker kept.

    A ratio the all-reduce's comparison multiplied into the first process's
    is no promise: unless this side by side shows a gain beyond the noise,
    the first process's best is handed back.
    """
    from keras_scaling.tune import _decision

    best = record["best"]
    start_settings = record["start"]["settings"]
    start_rates: list[float] = []
    best_rates: list[float] = []
    pair = [(first, start_settings, start_rates), (worker, best["settings"], best_rates)]
    pair_s = 0.0
    for index in range(_decision.MAX_ROUNDS):
        left_s = args.budget - (time.time() - started_at)
        if index >= _decision.MIN_ROUNDS and (
            left_s < pair_s + _END_S
            or _decision.is_clear(_decision.Comparison(tuple(start_rates), tuple(best_rates)))
        ):
            break
        pair_started_s = time.time()
        for process, these, rates in pair if index % 2 == 0 else reversed(pair):
            rates.append(process.round(these, steps)[0])
        pair_s = max(pair_s, time.time() - pair_started_s)
    comparison = _decision.Comparison(tuple(start_rates), tuple(best_rates))
    decision = _decision.decide(comparison)
    rounds = len(comparison.ratios)
    if decision.kept:
        first.finish()
        record["start"]["samples_per_sec"] = comparison.incumbent_median
        best["ratio_to_start"] = comparison.ratio
        best["samples_per_sec"] = comparison.incumbent_median * comparison.ratio
        best["ratio_source"] = (
            f"best against start, {rounds} alternating rounds, each in a process of its own"
        )
        return worker
    worker.finish()
    record["best"] = first_best
    record["notes"].append(
        f"the best with its all-reduce ran at {comparison.ratio:.2f}x the start side by "
        f"side ({decision.reason}): the all-reduce is left as it was"
    )
    for trial in record["trials"]:
        if trial["knob"] == "cross_device_ops" and trial["kept"]:
            trial["kept"] = False
            trial["reason"] += "; not confirmed against the start"
    return first
