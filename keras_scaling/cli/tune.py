"""`keras-scaling tune`: the fastest settings for a model on its devices, by measurement.

The search runs in `_tune_worker` processes: TensorFlow fixes the logical CPUs,
their thread pools and a strategy's all-reduce once per process.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from subprocess import PIPE

from keras_scaling.cli import _models, _sweep_plan, _worker
from keras_scaling.cli._arguments import add_model_options, log_dir_of, number, positive_int
from keras_scaling.cli._errors import UsageError

_DEFAULT_PER_REPLICA_BATCH = 64
_DEFAULT_BUDGET_S = 180.0
# The worker's last stderr line on bad input starts with this.
USAGE_PREFIX = "keras-scaling tune: error: "
# The worker's lines when it serves rounds (`keras_scaling.cli._tune_worker`).
READY = "@ready"
RATE = "@rate "
FAILED = "@failed "
QUIT = "quit"
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

_DESCRIPTION = """\
Find the fastest settings for training a model on this machine's devices,
by measurement, and write them to LOGDIR/tune.json, which
keras_scaling.tune.load reads back as keyword arguments.

Starts from the model's settings, tries the remedy of what explain finds
bounds the step first, and keeps a change only when its median gain over
alternating rounds of real model.fit calls exceeds the noise and 2%; the
best must beat the start side by side by the noise and 5% at the end.

Tried by default, keeping the model's arithmetic: steps_per_execution,
jit_compile, cache, private_threadpool_size and, each in a process of its
own from --budget 60 on, cross_device_ops and the CPU thread pools
(--cpu-devices). Tried only with --allow, as they change training: batch,
precision. The tune guide says when each applies and what it changes.

Under a cluster (keras-scaling launch, TF_CONFIG, a Slurm step), run it on
every worker: the workers search in step, on the chief's figures, and also
try the all-reduce across workers (bytes_per_pack, and on GPUs ring or
NCCL); the chief writes tune.json.

Prints the table of every knob tried and the lines that apply the best,
and writes the table into TensorBoard (run "tune", Text tab). --model and
--data are as for keras-scaling bench.
"""

_EXAMPLE = """\
examples:
  keras-scaling tune --cpu-devices 2 --model mlp --per-replica-batch 128
  keras-scaling tune --model my.models:build --data my.data:load --budget 600
  keras-scaling tune --cpu-devices 2 --model cnn --allow batch --logdir logs/tune
  keras-scaling launch --workers 2 -- keras-scaling tune --model mlp --logdir logs/tune
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
    add("--per-replica-batch", type=positive_int, metavar="B", help=batch_help)
    budget_help = f"seconds for the whole search (default {_DEFAULT_BUDGET_S:g})"
    add("--budget", type=number("seconds"), metavar="SECONDS", help=budget_help)
    allow_help = "knobs that change training, tried only when named: batch, precision"
    add("--allow", default="", metavar="KNOB[,KNOB]", help=allow_help)
    parser.set_defaults(
        run=run, per_replica_batch=_DEFAULT_PER_REPLICA_BATCH, budget=_DEFAULT_BUDGET_S
    )
    return parser


def _check(args):
    """Raises `UsageError` for bad arguments, before any process starts."""
    _models.check_specs(args)
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

    def __init__(self, args, log_dir, started_at, *, name, extra, shows_table=False):
        # The table and the outcome come once: from this command when it
        # writes them, with the knobs measured in processes of their own.
        self.hides_table = not shows_table
        names = ("model", "data", "per_replica_batch", "steps_per_execution", "budget", "allow")
        options = [(name, getattr(args, name)) for name in names]
        options += [("logdir", log_dir), ("started_at", started_at)]
        command = [sys.executable, "-m", "keras_scaling.cli._tune_worker", *extra]
        command += [
            f"--{name.replace('_', '-')}={value}" for name, value in options if value is not None
        ]
        env = {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ}
        # The worker's --cpu-kwargs alone decide its thread pools.
        env.pop("TF_OVERRIDE_GLOBAL_THREADPOOL", None)
        os.makedirs(log_dir, exist_ok=True)
        self.log_path = os.path.join(log_dir, name)
        # Its stderr (TensorFlow's start-up lines) goes to a log, shown when it fails.
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 (closed in finish)
        sys.stdout.flush()
        self.process = subprocess.Popen(
            command, stdin=PIPE, stdout=PIPE, stderr=self._log, env=env, text=True
        )

    def _lines(self, echo):
        assert self.process.stdout is not None  # a pipe
        for line in self.process.stdout:
            if line.startswith((RATE, FAILED)) or line.strip() == READY:
                yield line.strip()
            elif line.startswith("| knob") and self.hides_table:
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
        if line.startswith(FAILED):
            raise RuntimeError(line[len(FAILED) :])
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


def _devices(cpu_devices):
    """`(device kind, replicas)` the worker will train on (its logical CPUs may come from `keras-scaling launch`)."""
    from keras_scaling.launch._environment import CPU_DEVICES_ENV

    cpu_devices = cpu_devices or int(os.environ.get(CPU_DEVICES_ENV) or 0)
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


def _cluster():
    """`(workers, writes)`: the workers of the cluster this command is a task of, and whether it is the chief."""
    from keras_scaling import cluster

    try:
        spec = cluster.resolve_cluster()
    except ValueError:  # the worker's auto_strategy says what is wrong
        return 1, True
    if spec is None or spec.num_workers < 2:
        return 1, True
    chief = spec.task_type == "chief" or (not spec.chief and spec.task_index == 0)
    return spec.num_workers, chief


def _process_candidates(args, device_kind, replicas, start_cpu, workers=1):
    """`([(knob, value)], [(knob, reason)])`: what runs in processes of its own, and what not, why."""
    from keras_scaling.tune import _candidates

    if workers > 1:
        cpu_threads = (), "across workers, other pools would need the whole cluster restarted"
    else:
        cpu_threads = _candidates.cpu_thread_values(start_cpu, _sweep_plan.available_cores())
    candidates, skipped = [], []
    for knob, (values, reason) in (
        ("cross_device_ops", _candidates.all_reduce_values(device_kind, replicas, workers)),
        ("cpu_threads", cpu_threads),
    ):
        candidates += [(knob, value) for value in values]
        skipped += [(knob, reason)] if reason else []
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
    log_dir = log_dir_of(args.logdir, "tune")
    device_kind, replicas = _devices(args.cpu_devices)
    start_cpu = _start_cpu(args)
    # Under a cluster (TF_CONFIG, Slurm, launch), every task runs this command
    # and its worker searches in step with the others, the chief writing.
    workers, writes = _cluster()
    candidates, skipped = _process_candidates(args, device_kind, replicas, start_cpu, workers)
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
        name="tune_worker.log" if writes else f"tune_worker_{os.getpid()}.log",
        extra=extra + (["--serve"] if candidates else []),
        shows_table=not writes,
    )
    path = os.path.join(log_dir, "tune.json")
    try:
        ready = worker.wait_ready(echo=True)
        if not ready:
            returncode = worker.finish()
            if returncode:
                failed = f"keras-scaling tune: the search failed with exit status {returncode}"
                _worker.report_failure(worker.log_path, returncode, USAGE_PREFIX, failed)
                return returncode
        ready_s = time.time() - started_at
        if not writes:  # the worker printed the table; the chief's writes it
            return worker.finish() if ready else 0
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
    print("\n" + _report.text(record, path))
    return 0


def _traced_and_compared(incumbent, candidate, steps, rounds, left_s, reserve_s):
    """A first round of the `(worker, settings)` candidate, which traces, then `_search.alternate`'s rounds."""
    from keras_scaling.tune import _search

    candidate[0].round(candidate[1], steps)
    return _search.alternate(incumbent, candidate, steps, rounds, left_s, reserve_s=reserve_s)


def _add_trial(record, knob, value, comparison, candidate_settings):
    """Adds the trial of `comparison` to the record, and its settings to `best` when kept; returns whether kept."""
    from keras_scaling.tune import _candidates, _report, _search

    best = record["best"]
    trial = _search.trial_record(knob, value, comparison, incumbent_ratio=best["ratio_to_start"])
    record["trials"].append(trial)
    print(_report.trial_line(trial), flush=True)
    if trial["kept"]:
        best.update(
            settings=candidate_settings,
            ratio_to_start=trial["ratio_to_start"],
            samples_per_sec=record["start"]["samples_per_sec"] * trial["ratio_to_start"],
            ratio_source="the product of the kept changes' ratios",
        )
        if knob in _candidates.CHANGES_ROUNDING:
            record["notes"].append(_candidates.describe_change(knob, value, candidate_settings))
    return trial["kept"]


def _search_in_processes(args, record, first, candidates, started_at, ready_s, log_dir, kind):
    """Each knob a process fixes, in a process of its own in turns with the incumbent's; then the final side by side.

    The first process serves the incumbent's rounds until a candidate is
    kept; the kept candidate's process serves them from then on, and also
    measures what the first search had no time for while the budget lasts.
    """
    from keras_scaling.tune import _candidates, _decision, _search

    best, trials = record["best"], record["trials"]
    settings = best["settings"]
    per_replica_batch = settings["data"].get("per_replica_batch_size") or args.per_replica_batch
    step_s = per_replica_batch * record["replicas"] / best["samples_per_sec"]
    spe = int(settings["compile"].get("steps_per_execution", 1))
    round_s = _search.round_s_for(args.budget)
    steps = _decision.steps_per_round(step_s, round_s, spe)
    # What starting a worker costs: its time to the first round, tune's own search aside.
    start_up_s = max(1.0, ready_s - record["elapsed_s"])
    warm_up_s = record.get("timeline_s", {}).get("warm_up_s", 0.0)
    # The serving runner traces its train function again: its first round
    # is a warm-up; the second gives the cost of a round.
    first.round(settings, steps)
    pair_s = 2 * first.round(settings, steps)[1]
    timeline = {"ready_s": ready_s, "start_up_s": start_up_s, "round_pair_s": pair_s}
    record.setdefault("timeline_s", {})["processes"] = timeline
    # The start runs at 1/ratio of the best's speed in the final side by side.
    confirm_reserve_s = (
        _CONFIRM_MARGIN * _decision.MIN_ROUNDS * pair_s / 2 * (1 + best["ratio_to_start"])
    )

    def left_s():
        return args.budget - (time.time() - started_at) - _END_S

    worker, out_of_budget = first, False
    for knob, value in candidates:
        candidate_settings = _candidates.with_value(settings, knob, value)
        reason = _search.NOT_MEASURED if out_of_budget else "not tried: already so"
        if out_of_budget or candidate_settings == settings:
            trials.append(_search.trial_record(knob, value, reason=reason))
            continue
        # Another process starts about as the first did; its tracing is as
        # the first's warm-up; ending the processes takes a few seconds.
        overhead_s = _START_MARGIN * start_up_s + warm_up_s + _END_S
        left = args.budget - (time.time() - started_at)
        rounds = _decision.rounds_affordable(left, pair_s, overhead_s, reserve_s=confirm_reserve_s)
        if rounds == 0:
            out_of_budget = True
            needed_s = _decision.minimum_cost_s(pair_s, overhead_s) + confirm_reserve_s
            reason = (
                f"not measured: the budget is spent ({max(0.0, left):.0f} s left, "
                f"about {needed_s:.0f} s needed with the final side by side)"
            )
            trials.append(_search.trial_record(knob, value, reason=reason))
            continue
        candidate = _Worker(
            args,
            log_dir,
            started_at,
            name=f"tune_worker_{knob}_{len(trials)}.log",
            extra=[
                "--serve-only",
                f"--strategy-kwargs={json.dumps(candidate_settings['strategy'])}",
                f"--cpu-kwargs={json.dumps(candidate_settings['cpu'])}",
            ],
        )
        try:
            if not candidate.wait_ready(echo=False):
                raise RuntimeError(f"it ended before its first round; see {candidate.log_path}")
            comparison, slowest_pair_s = _traced_and_compared(
                (worker, settings), (candidate, candidate_settings), steps, rounds, left_s,
                confirm_reserve_s,
            )  # fmt: skip
        except (RuntimeError, OSError, ValueError) as error:
            candidate.kill()
            trials.append(_search.trial_record(knob, value, reason=f"failed: {error}"))
            continue
        pair_s = max(pair_s, slowest_pair_s)
        if len(comparison.ratios) < _decision.MIN_ROUNDS:
            candidate.finish()
            out_of_budget = True
            trials.append(_search.trial_record(knob, value, reason=_search.NOT_MEASURED))
            continue
        if knob == "cross_device_ops" and not any(
            trial["knob"] == knob and trial["ratio_to_incumbent"] for trial in trials
        ):
            record["notes"].append(
                f"all-reduce: TensorFlow's choice on {kind} is "
                f"{_candidates.default_all_reduce(kind)}; each other one ran in a "
                "process of its own, in turns with it"
            )
        if not _add_trial(record, knob, value, comparison, candidate_settings):
            candidate.finish()
            continue
        if worker is not first:  # the first serves the start's rounds at the end
            worker.finish()
        worker, settings = candidate, candidate_settings
    # The budget they left goes to what the first search had no time for,
    # in the incumbent's process.
    for trial in [trial for trial in trials if _search.NOT_MEASURED == trial["reason"]]:
        knob, value = trial["knob"], trial["value"]
        if _candidates.SECTION.get(knob) not in ("compile", "data") or value is None:
            continue
        candidate_settings = _candidates.with_value(settings, knob, value)
        if candidate_settings == settings:
            continue
        candidate_steps = _search.steps_for(step_s, round_s, settings, candidate_settings)
        candidate_pair_s = pair_s * candidate_steps / steps
        left = args.budget - (time.time() - started_at)
        rounds = _decision.rounds_affordable(
            left, candidate_pair_s, warm_up_s + _END_S, reserve_s=confirm_reserve_s
        )
        if not rounds:
            break
        try:
            comparison, _ = _traced_and_compared(
                (worker, settings), (worker, candidate_settings), candidate_steps, rounds,
                left_s, confirm_reserve_s,
            )  # fmt: skip
        except (RuntimeError, OSError, ValueError) as error:
            trial["reason"] = f"failed: {error}"
            continue
        if len(comparison.ratios) < _decision.MIN_ROUNDS:
            break
        trials.remove(trial)
        if _add_trial(record, knob, value, comparison, candidate_settings):
            settings, steps = candidate_settings, candidate_steps
    if settings != record["start"]["settings"]:
        start = (first, record["start"]["settings"])
        rounds = _decision.MAX_ROUNDS
        comparison, _ = _search.alternate(
            start, (worker, settings), steps, rounds, left_s, min_rounds=_decision.MIN_ROUNDS
        )
        where = "" if worker is first else ", each in a process of its own"
        _search.confirm_best(record, comparison, where)
    if worker is not first:
        worker.finish()
