"""`keras-scaling tune`: the fastest settings for a model on its devices, by measurement.

The command checks its arguments, then runs the search in a process of its
own (`keras_scaling.cli._tune_worker`): TensorFlow fixes the number of
logical CPUs and its thread pools once per process. That process then
serves rounds while another process, with another all-reduce or other CPU
thread pools, runs in turns with it: a strategy's all-reduce is fixed when
it is made, and two MirroredStrategy objects in one process break each
other's.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from keras_scaling.cli import _models, _sweep_plan
from keras_scaling.cli._arguments import add_model_options, positive_int, positive_number
from keras_scaling.cli._errors import UsageError

_DEFAULT_PER_REPLICA_BATCH = 64
_DEFAULT_BUDGET_S = 180.0
# The worker's last stderr line on bad input starts with this.
USAGE_PREFIX = "keras-scaling tune: error: "
# The worker's lines when it serves rounds (`keras_scaling.cli._tune_worker`).
READY = "@ready"
RATE = "@rate "
QUIT = "quit"
_WORKER_LOG = "tune_worker.log"
# Share of the budget kept for the knobs measured in processes of their own
# (the all-reduce, the CPU thread pools) and the final side by side.
_PROCESS_SHARE = 0.35
# From this budget on, half: each candidate process's start, warm-up and
# rounds take about 30 s on 2 cores, the final side by side about 20 s.
_PROCESS_SHARE_LARGE = 0.5
_LARGE_BUDGET_S = 150.0
# The smallest budget that also measures them.
_PROCESS_MIN_BUDGET_S = 60.0
# A candidate process's start, over the first's; the final side by side's
# reserve, over its estimate: the load changes during the search.
_START_MARGIN = 1.2
_CONFIRM_MARGIN = 1.2
# Seconds a worker gets to end after it is told to, and then to be killed.
_END_S = 5.0
_LOG_TAIL_LINES = 25

_DESCRIPTION = """\
Find the fastest settings for training a model on this machine's devices,
by measurement, and write them where one line applies them.

Starts from the model's settings, tries the remedy of what explain finds
bounds the step first, keeps a change only when its median gain over
alternating rounds of real model.fit calls exceeds the noise and 5%, and
confirms the best side by side with the start at the end (docs/guides/tune.md).

Knobs that keep the model's arithmetic, tried by default:
  steps_per_execution   the same weights, bitwise
  jit_compile           XLA: other kernels, the same mathematics up to float
                        rounding (not with several replicas on CPUs)
  cache                 the input pipeline's cache (--data pipelines; arrays
                        are in memory already)
  private_threadpool_size
                        tf.data's threads: a pool of the pipeline's own
                        (map parallelism and prefetch are AUTOTUNE already)
  cross_device_ops      the all-reduce, on several devices of one machine
  cpu_threads           TensorFlow's CPU thread pools, on logical CPUs
                        (--cpu-devices): each of these two in a process of
                        its own, in turns with the first's (35% of the
                        budget, half from --budget 150 on, the final side
                        by side included; from --budget 60 on); across
                        workers nothing is measured
Knobs that change training, tried only with --allow:
  batch                 the per-replica batch: scale the learning rate
  precision             mixed precision (GPUs and TPUs)

Prints the table of every knob tried (samples/sec median and spread, ratio
to the incumbent and to the start, kept or not and why), writes
LOGDIR/tune.json and the table into TensorBoard (run "tune", Text tab).
Apply the result with:

  tuned = keras_scaling.tune.load("LOGDIR/tune.json")
  keras_scaling.use_logical_cpus(**tuned.cpu_kwargs)   # logical CPUs only
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
    add_model_options(parser, "tune", "tune.json and the TensorBoard run")
    add = parser.add_argument
    batch_help = f"each replica's batch at the start (default {_DEFAULT_PER_REPLICA_BATCH})"
    add(
        "--per-replica-batch",
        type=positive_int,
        default=_DEFAULT_PER_REPLICA_BATCH,
        metavar="B",
        help=batch_help,
    )
    budget_help = f"seconds for the whole search (default {_DEFAULT_BUDGET_S:g})"
    add(
        "--budget",
        type=positive_number("seconds"),
        default=_DEFAULT_BUDGET_S,
        metavar="SECONDS",
        help=budget_help,
    )
    allow_help = "knobs that change training, tried only when named: batch, precision"
    add("--allow", default="", metavar="KNOB[,KNOB]", help=allow_help)
    parser.set_defaults(run=run)
    return parser


def _check(args):
    """Raises `UsageError` for bad arguments, before any process starts."""
    _models.check_spec(args.model)
    if args.data is not None:
        _models.check_data_spec(args.data)
    from keras_scaling.tune import _candidates, _search

    try:
        _candidates.parse_allow(args.allow)
    except ValueError as error:
        raise UsageError(f"--{error}") from None

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
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # The worker's --cpu-kwargs alone decide its thread pools.
        env.pop("TF_OVERRIDE_GLOBAL_THREADPOOL", None)
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


def _start_cpu(args):
    """The start's `use_logical_cpus` settings: the bench's thread pools, or none on GPUs."""
    if not args.cpu_devices:
        return {}
    threads = _sweep_plan.plan_cpu_threads([args.cpu_devices], _sweep_plan.available_cores())
    return {
        "n": args.cpu_devices,
        "threads_per_device": threads.intra_op_threads(),
        "inter_op_threads": threads.inter_op_threads(args.cpu_devices),
    }


def _process_candidates(args, device_kind, replicas, start_cpu):
    """`([(knob, value)], [(knob, reason)])`: what runs in processes of its own, and what not, why."""
    from keras_scaling.tune import _candidates

    candidates, skipped = [], []
    values, reason = _candidates.all_reduce_values(device_kind, replicas, 1)
    candidates += [("cross_device_ops", value) for value in values]
    if reason:
        skipped.append(("cross_device_ops", reason))
    values, reason = _candidates.cpu_thread_values(start_cpu, _sweep_plan.available_cores())
    candidates += [("cpu_threads", value) for value in values]
    if reason:
        skipped.append(("cpu_threads", reason))
    if candidates and args.budget < _PROCESS_MIN_BUDGET_S:
        # Their share would leave the first search too little to measure anything.
        reason = f"--budget {args.budget:g} leaves them no time; pass --budget 60 or more"
        skipped += [(knob, reason) for knob in dict(candidates)]
        candidates = []
    return candidates, skipped


def run(args):
    """Checks the arguments, runs the search in worker processes; returns the exit status."""
    from keras_scaling.tune import _report, _search

    _check(args)
    started_at = time.time()
    log_dir = args.logdir or os.path.join("logs", time.strftime("tune-%Y%m%d-%H%M%S"))
    log_dir = os.path.abspath(log_dir)
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        raise UsageError(f"--logdir {log_dir!r} is a file; pass a directory")
    device_kind, replicas = _devices(args.cpu_devices)
    start_cpu = _start_cpu(args)
    candidates, skipped = _process_candidates(args, device_kind, replicas, start_cpu)
    # Kept back from the search in the first process: the share of the
    # knobs measured in processes of their own and of the final side by
    # side, and the seconds the processes take to end.
    share = _PROCESS_SHARE_LARGE if args.budget >= _LARGE_BUDGET_S else _PROCESS_SHARE
    reserve_s = (share * args.budget if candidates else 0.0) + _END_S
    extra = [f"--reserve={reserve_s}", f"--cpu-kwargs={json.dumps(start_cpu)}"]
    worker = _Worker(
        args,
        log_dir,
        started_at,
        name=_WORKER_LOG,
        extra=extra + (["--serve"] if candidates else []),
    )
    path = os.path.join(log_dir, "tune.json")
    try:
        ready = worker.wait_ready(echo=True)
        if not ready:
            returncode = worker.finish()
            if returncode:
                return worker.failure(returncode)
        ready_s = time.time() - started_at
        with open(path, encoding="utf-8") as file:
            record = json.load(file)
        record["trials"] += [
            _search.trial_record(knob, None, reason=f"not tried: {reason}")
            for knob, reason in skipped
        ]
        if ready:
            _search_in_processes(
                args, record, worker, candidates, started_at, ready_s, log_dir, device_kind
            )
    except BaseException:
        worker.kill()
        raise
    worker.finish()
    record["elapsed_s"] = time.time() - started_at
    record["budget_s"] = args.budget
    _report.write(log_dir, record)
    print("\n" + _report.format_table(record["trials"]) + "\n")
    print("\n".join(_report.summary_lines(record)))
    print("\nApply it:")
    print("\n".join(f"  {line}" for line in _report.apply_lines(record, path)))
    return 0


def _process_settings(settings):
    """What a process fixes when it starts: the strategy's and the CPU's settings."""
    return {"strategy": settings["strategy"], "cpu": settings.get("cpu", {})}


def _search_in_processes(
    args, record, first, candidates, started_at, ready_s, log_dir, device_kind
):
    """Each knob a process fixes, against the incumbent, in a process of its own; then the final side by side.

    The first process serves the incumbent's rounds until a candidate is
    kept; the kept candidate's process serves them from then on.
    """
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
    # The serving runner traces its train function again: its first round
    # is a warm-up; the second gives the cost of a round.
    first.round(settings, steps)
    _, pair_s = first.round(settings, steps)
    pair_s *= 2
    worker = first
    record.setdefault("timeline_s", {})["processes"] = {
        "ready_s": ready_s,
        "start_up_s": start_up_s,
        "round_pair_s": pair_s,
    }
    # The start runs at 1/ratio of the best's speed in the final side by side.
    confirm_reserve_s = (
        _CONFIRM_MARGIN * _decision.MIN_ROUNDS * pair_s / 2 * (1 + best["ratio_to_start"])
    )
    out_of_budget = False
    for knob, value in candidates:
        candidate_settings = _candidates.with_value(settings, knob, value)
        if out_of_budget or candidate_settings == settings:
            reason = (
                "not measured: the budget is spent" if out_of_budget else "not tried: already so"
            )
            record["trials"].append(_search.trial_record(knob, value, reason=reason))
            continue
        left_s = args.budget - (time.time() - started_at)
        # Another process starts about as the first did; its tracing is as
        # the first's warm-up; ending the processes takes a few seconds.
        overhead_s = _START_MARGIN * start_up_s + warm_up_s + _END_S
        rounds = _decision.rounds_affordable(
            left_s, pair_s, overhead_s, reserve_s=confirm_reserve_s
        )
        if rounds == 0:
            out_of_budget = True
            needed_s = _decision.minimum_cost_s(pair_s, overhead_s) + confirm_reserve_s
            reason = (
                f"not measured: the budget is spent ({max(0.0, left_s):.0f} s left, "
                f"about {needed_s:.0f} s needed with the final side by side)"
            )
            record["trials"].append(_search.trial_record(knob, value, reason=reason))
            continue
        candidate = _Worker(
            args,
            log_dir,
            started_at,
            name=f"tune_worker_{knob}_{len(record['trials'])}.log",
            extra=[
                "--serve-only",
                f"--strategy-kwargs={json.dumps(candidate_settings['strategy'])}",
                f"--cpu-kwargs={json.dumps(candidate_settings['cpu'])}",
            ],
        )
        try:
            if not candidate.wait_ready(echo=False):
                raise RuntimeError(f"it ended before its first round; see {candidate.log_path}")
            candidate.round(candidate_settings, steps)  # traces
            comparison, pair_s = _alternate(
                (worker, settings),
                (candidate, candidate_settings),
                steps,
                rounds,
                args,
                started_at,
                pair_s,
                reserve_s=confirm_reserve_s,
            )
        except (RuntimeError, OSError, ValueError) as error:
            candidate.kill()
            record["trials"].append(_search.trial_record(knob, value, reason=f"failed: {error}"))
            continue
        if len(comparison.ratios) < _decision.MIN_ROUNDS:
            candidate.finish()
            out_of_budget = True
            record["trials"].append(
                _search.trial_record(knob, value, reason="not measured: the budget is spent")
            )
            continue
        if knob == "cross_device_ops" and not any(
            trial["knob"] == knob and trial["ratio_to_incumbent"] for trial in record["trials"]
        ):
            record["notes"].append(
                f"all-reduce: TensorFlow's choice on {device_kind} is "
                f"{_candidates.default_all_reduce(device_kind)}; each other one ran in a "
                "process of its own, in turns with it"
            )
        decision = _decision.decide(comparison)
        ratio_to_start = best["ratio_to_start"] * comparison.ratio
        record["trials"].append(
            _search.trial_record(
                knob, value, comparison=comparison, decision=decision, ratio_to_start=ratio_to_start
            )
        )
        print(
            f"  {knob}={_report_value(value)}: {comparison.candidate_median:,.0f} samples/sec, "
            f"{comparison.ratio:.2f}x the incumbent: "
            f"{'kept' if decision.kept else 'not kept'} ({decision.reason})",
            flush=True,
        )
        if not decision.kept:
            candidate.finish()
            continue
        if worker is not first:  # the first serves the start's rounds at the end
            worker.finish()
        worker, settings = candidate, candidate_settings
        best["settings"] = settings
        best["ratio_to_start"] = ratio_to_start
        best["samples_per_sec"] = record["start"]["samples_per_sec"] * ratio_to_start
        best["ratio_source"] = "the product of the kept changes' ratios"
        if knob in _candidates.CHANGES_ROUNDING:
            record["notes"].append(_candidates.describe_change(knob, value, settings))
    _confirm(args, record, first, worker, steps, started_at)
    if worker is not first:
        worker.finish()


def _report_value(value):
    from keras_scaling.tune import _report

    return _report._value(value)


def _alternate(incumbent, candidate, steps, rounds, args, started_at, pair_s, **kwargs):
    """`_search.alternate` over `(worker, settings)` pairs; returns the comparison and the slowest pair's seconds."""
    from keras_scaling.tune import _search

    comparison, slowest_s = _search.alternate(
        lambda: incumbent[0].round(incumbent[1], steps)[0],
        lambda: candidate[0].round(candidate[1], steps)[0],
        rounds,
        lambda: args.budget - (time.time() - started_at) - _END_S,
        **kwargs,
    )
    return comparison, max(pair_s, slowest_s)


def _confirm(args, record, first, worker, steps, started_at):
    """The start (in the first process) against the best (in `worker`, maybe the first), side by side.

    A product of ratios measured one knob at a time is no promise: unless
    this side by side shows a gain beyond the noise, the start is handed back.
    """
    from keras_scaling.tune import _decision

    best = record["best"]
    start = record["start"]
    if best["settings"] == start["settings"]:
        return
    comparison, _ = _alternate(
        (first, start["settings"]),
        (worker, best["settings"]),
        steps,
        _decision.MAX_ROUNDS,
        args,
        started_at,
        0.0,
        min_rounds=_decision.MIN_ROUNDS,
    )
    decision = _decision.decide(comparison)
    rounds = len(comparison.ratios)
    where = "" if worker is first else ", each in a process of its own"
    start["samples_per_sec"] = comparison.incumbent_median
    if decision.kept:
        best["ratio_to_start"] = comparison.ratio
        best["samples_per_sec"] = comparison.incumbent_median * comparison.ratio
        best["ratio_source"] = f"best against start, {rounds} alternating rounds{where}"
        return
    record["notes"].append(
        f"the kept changes ran at {comparison.ratio:.2f}x the start side by side "
        f"({decision.reason}): the start is kept"
    )
    best.update(
        settings=start["settings"],
        samples_per_sec=comparison.incumbent_median,
        ratio_to_start=1.0,
        ratio_source=f"kept changes not faster than the start in {rounds} alternating rounds",
        trains_the_same=True,
    )
    for trial in record["trials"]:
        if trial["kept"]:
            trial["kept"] = False
            trial["reason"] += "; not confirmed against the start"
