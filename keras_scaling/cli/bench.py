"""`keras-scaling bench`: the speedup table of your model over replica counts."""

import argparse
import collections
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from keras_scaling.cli import _bench_worker, _models, _plot, _speedup_table, _sweep_plan, _worker
from keras_scaling.cli._arguments import add_model_options, log_dir_of, positive_int
from keras_scaling.cli._errors import UsageError

_DEFAULT_STEPS = 100
_EFFICIENT = 0.9
_RUN_DIR_PATTERN = re.compile(r"(replicas|batch)_\d+")
# The run, under LOGDIR, that holds the sweep's table and plots.
SUMMARY_RUN = "summary"

_DESCRIPTION = """\
Train a model at several replica counts, each in a process of its own with
MirroredStrategy over the first N GPUs (or N logical CPUs with --cpu-devices),
and print samples/sec, the speedup over 1 replica, the scaling efficiency
(speedup / replicas), the ideal, model FLOP/s and MFU. Writes
LOGDIR/scaling.json, LOGDIR/scaling.png (with matplotlib: pip install
'keras-scaling[plot]') and TensorBoard summaries (tensorboard --logdir LOGDIR).
The bench guide says how it measures.
"""

_EXAMPLE = """\
examples:
  keras-scaling bench --cpu-devices 2 --model mlp --steps 60
  keras-scaling bench --replicas 1,2,4,8 --model resnet50 --per-replica-batch 128
  keras-scaling bench --cpu-devices 2 --per-replica-batch 16,32,64,128 --peak-flops measure
  keras-scaling bench --model my_project.models:build --global-batch 512
  keras-scaling bench --cpu-devices 2 --explain --model my.models:build --data my.data:load
"""


def add_parser(subparsers):
    """Registers the `bench` subcommand on an argparse `subparsers` object."""
    parser = subparsers.add_parser(
        "bench",
        help="measure speedup and scaling efficiency over replica counts",
        description=_DESCRIPTION,
        epilog=_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_options(parser, "bench", "the runs, scaling.json and the plots")
    add = parser.add_argument
    replicas_help = (
        "replica counts, such as 1,2,4 (default: 1, then powers of two up to all devices)"
    )
    add("--replicas", metavar="LIST", help=replicas_help)
    batch = parser.add_mutually_exclusive_group().add_argument
    weak_help = "weak scaling: each replica's batch (default 64); several, such as 16,32, sweep it"
    batch("--per-replica-batch", metavar="B[,B...]", help=weak_help)
    strong_help = "strong scaling: the global batch, split over the replicas"
    batch("--global-batch", type=positive_int, metavar="G", help=strong_help)
    steps_help = f"training steps per replica count (default {_DEFAULT_STEPS})"
    add("--steps", type=positive_int, default=_DEFAULT_STEPS, metavar="S", help=steps_help)
    add("--overwrite", action="store_true", help="replace an earlier bench's results in LOGDIR")
    peak_help = (
        "one replica's peak FLOPs/sec for MFU: auto (datasheets of GPUs and TPUs), measure "
        "(a timed matrix multiply) or a number such as 312e12 (default auto)"
    )
    add("--peak-flops", default="auto", metavar="auto|measure|FLOPS", help=peak_help)
    add("--seed", type=int, default=0, help="seed of the synthetic data (default 0)")
    explain_help = (
        "split each count's step into input, compute, synchronization and host overhead; "
        "writes LOGDIR/explain.json"
    )
    add("--explain", action="store_true", help=explain_help)
    parser.set_defaults(run=run)
    return parser


# groups: `(run directory prefix, sweep points)` per per-replica batch;
# batch_sweep: the per-replica batches, when several are swept, else None.
_Sweep = collections.namedtuple(
    "_Sweep", "groups batch_sweep device_kind num_devices scaling_mode cpu_threads"
)


def run(args):
    """Runs the sweep of `args`; returns the exit status."""
    sweep = _plan_sweep(args)
    log_dir = _prepare_log_dir(args.logdir, args.overwrite)
    points = [point for _, group in sweep.groups for point in group]
    counts = ", ".join(str(count) for count in sorted({point.replicas for point in points}))
    print(
        f"Bench: model {args.model}, {sweep.scaling_mode} scaling, {args.steps} steps per "
        f"count, replicas {counts} on {sweep.device_kind}"
    )
    if sweep.num_devices == 1 and not args.cpu_devices:
        print("Only one device: pass --cpu-devices N to sweep over N logical CPUs.")
    if sweep.cpu_threads is not None:
        print(sweep.cpu_threads.describe())
    print(f"Logs: {log_dir}", flush=True)

    summaries, index = [], 0
    for prefix, group in sweep.groups:
        # The 1-replica count runs first and is every later count's baseline,
        # so the table's speedup and the logged one are the same figure.
        baseline = "auto" if group[0].replicas == 1 else "measure"
        runs = []
        for point in group:
            index += 1
            label = f"[{index}/{len(points)}] {point.replicas} replica(s), global batch "
            label += str(point.global_batch_size)
            run_or_status = _run_point(args, sweep, point, label, log_dir, baseline, prefix)
            if isinstance(run_or_status, int):
                return run_or_status
            runs.append(run_or_status)
            if point.replicas == 1:
                baseline = run_or_status.path
        summaries.append(_speedup_table.summarize(runs))

    texts = []
    for summary in summaries:
        batch = summary.rows[0].per_replica_batch_size
        heading = f"Per-replica batch {batch}:\n" if sweep.batch_sweep else ""
        texts.append(heading + _speedup_table.summary_text(summary))
    summary, efficient_batch = summaries[0], None
    if sweep.batch_sweep:
        summary = _speedup_table.Summary(
            rows=tuple(row for s in summaries for row in s.rows),
            baseline_samples_per_sec=None,
            baseline_source="the 1-replica run of each per-replica batch",
            notes=tuple(note for s in summaries for note in s.notes),
        )
        efficient_batch, largest = _speedup_table.smallest_efficient_batch(summary.rows, _EFFICIENT)
        texts.append(
            f"No per-replica batch up to {sweep.batch_sweep[-1]} reaches an efficiency of "
            f"{_EFFICIENT:.2f} at {largest} replicas: try larger batches."
            if efficient_batch is None
            else f"Smallest per-replica batch reaching an efficiency of {_EFFICIENT:.2f} at "
            f"{largest} replicas: {efficient_batch}."
        )
    text = "\n\n".join(texts)
    print(f"\n{text}")
    written = _write_results(log_dir, summary, text, efficient_batch, args, sweep)
    if args.explain:
        written.append(_explain(log_dir, summary, efficient_batch, args, sweep))
    print(f"\nWrote {', '.join(os.path.join(log_dir, name) for name in written)}.")
    print(f"Open TensorBoard: tensorboard --logdir {shlex.quote(log_dir)}")
    return 0


def _plan_sweep(args):
    """Checks the arguments and plans the sweep; raises `UsageError`."""
    _models.check_specs(args)
    if args.cpu_devices:
        num_devices, device_kind = args.cpu_devices, f"{args.cpu_devices} logical CPU(s)"
    else:
        import tensorflow as tf

        num_devices = len(tf.config.list_physical_devices("GPU"))
        device_kind = f"{num_devices} GPU(s)" if num_devices else "1 CPU, no GPU"
        num_devices = max(num_devices, 1)
    if args.replicas is None:
        replica_counts = _sweep_plan.default_replica_counts(num_devices)
    else:
        replica_counts = _sweep_plan.parse_replica_counts(args.replicas)
        _sweep_plan.check_replica_counts(replica_counts, num_devices, device_kind)
    from keras_scaling.mfu import utilization

    try:
        utilization.check_peak_flops(
            _bench_worker.number_or_word(args.peak_flops), parameter="--peak-flops"
        )
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None
    plan = _sweep_plan.plan_batches
    if args.global_batch is not None:
        batches = None
        groups = [("", plan(replica_counts, global_batch_size=args.global_batch))]
    else:
        batches = _sweep_plan.parse_batch_sizes(args.per_replica_batch or "64")
        groups = [
            (
                f"batch_{batch}/" if len(batches) > 1 else "",
                plan(replica_counts, per_replica_batch_size=batch),
            )
            for batch in batches
        ]
    cpu_threads = None
    if args.cpu_devices:
        cpu_threads = _sweep_plan.plan_cpu_threads(replica_counts, _sweep_plan.available_cores())
    batch_sweep = batches if batches and len(batches) > 1 else None
    scaling_mode = "strong" if args.global_batch else "weak"
    return _Sweep(groups, batch_sweep, device_kind, num_devices, scaling_mode, cpu_threads)


def _prepare_log_dir(log_dir, overwrite):
    """The absolute LOGDIR, emptied of an earlier bench's results with `overwrite`."""
    log_dir = log_dir_of(log_dir, "bench")
    names = set(os.listdir(log_dir)) if os.path.isdir(log_dir) else set()
    outputs = {"scaling.json", "scaling.png", "efficiency.png", "explain.json"}
    earlier = {name for name in names if _RUN_DIR_PATTERN.fullmatch(name) or name in outputs}
    # Without a scaling.json beside them, these may be a user's own TensorBoard
    # runs (`train` held the summary in earlier versions).
    if "scaling.json" in names:
        earlier.update(names & {SUMMARY_RUN, "train", "explain"})
    if earlier and not overwrite:
        raise UsageError(
            f"--logdir {log_dir!r} already holds bench results ({', '.join(sorted(earlier))}); "
            "pass a new directory, or --overwrite to replace them"
        )
    for path in (os.path.join(log_dir, name) for name in earlier):
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    from keras_scaling.summaries import _tensorboard

    try:
        return _tensorboard.check_log_dir(log_dir, parameter="--logdir", run=SUMMARY_RUN)
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None


def _run_point(args, sweep, point, label, log_dir, baseline, prefix):
    """Trains one count in a child process; returns its `Run`, or an exit status."""
    run_name = f"{prefix}replicas_{point.replicas}"
    run_dir = os.path.join(log_dir, run_name)
    os.makedirs(run_dir, exist_ok=True)
    options = {
        "replicas": point.replicas,
        "model": args.model,
        "per-replica-batch": point.per_replica_batch_size,
        "steps": args.steps,
        "steps-per-execution": args.steps_per_execution,
        "log-dir": run_dir,
        "baseline": baseline,
        "seed": args.seed,
        "peak-flops": args.peak_flops,
        "data": args.data,
    }
    threads = sweep.cpu_threads
    if threads is not None:
        options["intra-op-threads"] = threads.intra_op_threads()
        options["inter-op-threads"] = threads.inter_op_threads(point.replicas)
    command = [sys.executable, "-m", "keras_scaling.cli._bench_worker"]
    command += [f"--{name}={value}" for name, value in options.items() if value is not None]
    command += ["--explain"] * args.explain + ["--cpu-devices"] * (threads is not None)
    log_path = os.path.join(run_dir, "bench_worker.log")
    progress = _Progress(label, args.steps)
    start_s = time.perf_counter()
    # The child's stderr goes to the log; its stdout comes through here, which
    # keeps the progress lines and appends the rest to the same log.
    with open(log_path, "w", encoding="utf-8") as log:
        env = {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ}
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            text=True,
        )
        assert process.stdout is not None  # a pipe
        try:
            for line in process.stdout:
                if line.startswith(_bench_worker.PROGRESS_PREFIX):
                    progress.update(*map(int, line.split()[1:]))
                else:
                    log.write(line)
                    log.flush()
            returncode = process.wait()
        except BaseException:
            _stop(process)
            progress.end()
            raise
    progress.end()
    throughput_path = os.path.join(run_dir, _speedup_table.THROUGHPUT_FILE)
    if returncode == 0 and os.path.exists(throughput_path):
        try:
            run = _speedup_table.read_run(throughput_path, run_name)
        except ValueError as error:
            raise UsageError(
                f"the run with {point.replicas} replica(s) gave no throughput figure "
                f"({error}); pass more --steps than {args.steps}"
            ) from None
        elapsed_s = time.perf_counter() - start_s
        print(f"{label}: {run.throughput['samples_per_sec']:.1f} samples/sec ({elapsed_s:.0f} s)")
        return run
    how = f"failed with exit status {returncode}"
    if returncode <= 0:
        how = (
            "wrote no throughput.json" if returncode == 0 else f"was killed by signal {-returncode}"
        )
    failed = f"keras-scaling bench: the run with {point.replicas} replica(s) {how}"
    _worker.report_failure(log_path, returncode, _bench_worker.USAGE_PREFIX, failed)
    return 1


def _stop(process):
    """Terminates `process`, then kills it if it is still there after 10 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class _Progress:
    """A count's progress bar on a terminal; elsewhere a line when it starts."""

    def __init__(self, label, steps):
        self._label, self._tty, self._width = label, sys.stdout.isatty(), 0
        if self._tty:
            self.update(0, steps)
        else:
            print(f"{label}: training {steps} steps ...", flush=True)

    def update(self, done, steps):
        if self._tty:
            bar = "#" * (30 * done // max(steps, 1))
            text = f"{self._label}  [{bar:-<30}] {done}/{steps} steps"
            sys.stdout.write("\r" + text.ljust(self._width))
            sys.stdout.flush()
            self._width = len(text)

    def end(self):
        """Clears the bar, so that the count's result line replaces it."""
        if self._width:
            sys.stdout.write("\r" + " " * self._width + "\r")
            sys.stdout.flush()
            self._width = 0


def _write_results(log_dir, summary, text, efficient_batch, args, sweep):
    """Writes scaling.json, the charts and TensorBoard's table; returns the files written."""
    from keras_scaling.summaries import _tensorboard

    title = f"{args.model}, {sweep.scaling_mode} scaling on {sweep.device_kind}"
    threads = sweep.cpu_threads
    by_batch = sweep.batch_sweep is not None
    setup = {
        "title": title,
        "model": args.model,
        "scaling": sweep.scaling_mode,
        "device_kind": sweep.device_kind,
        "steps": args.steps,
        "steps_per_execution": args.steps_per_execution,
        "cpu_cores": threads.cores if threads else None,
        "cpu_threads_per_replica": threads.threads_per_replica if threads else None,
        "peak_flops": args.peak_flops,
    }
    if by_batch:
        setup["per_replica_batches"] = sweep.batch_sweep
        setup["smallest_efficient_per_replica_batch"] = efficient_batch
    with open(os.path.join(log_dir, "scaling.json"), "w", encoding="utf-8") as file:
        json.dump(_speedup_table.summary_to_json(summary, **setup), file, indent=2)
        file.write("\n")
    speedup = ("scaling.png", "scaling/speedup_vs_replicas", _plot.scaling_plot_png, by_batch)
    charts: list[tuple] = [speedup]
    if by_batch:
        tag = "scaling/efficiency_vs_per_replica_batch"
        charts.append(("efficiency.png", tag, _plot.efficiency_plot_png, _EFFICIENT))
    written = ["scaling.json"]
    for name, tag, draw, option in charts:
        try:
            png = draw(summary.rows, title, option)
        except _plot.MatplotlibMissing as error:
            print(f"\nNo charts ({', '.join(chart[0] for chart in charts)}): {error}.", flush=True)
            break
        with open(os.path.join(log_dir, name), "wb") as file:
            file.write(png)
        _tensorboard.write_image(log_dir, 0, tag, png, run=SUMMARY_RUN)
        written.append(name)
    _tensorboard.write_text(log_dir, 0, "scaling/table", text, run=SUMMARY_RUN)
    return written


def _explain(log_dir, summary, efficient_batch, args, sweep):
    """Prints and writes the split of each count's step; returns explain.json's path."""
    from keras_scaling.explain import _report, _writer

    explanations = []
    for row in summary.rows:
        path = os.path.join(log_dir, row.run, _bench_worker.EXPLAIN_FILE)
        with open(path, encoding="utf-8") as file:
            measured = json.load(file)  # measurements, mfu and mfu_reason
        measurements = measured.pop("measurements")
        explanations.append(
            _report.explanation(
                measurements, efficient_per_replica_batch=efficient_batch, **measured
            )
        )
    print("\nExplain: the step split into input, compute, synchronization and host overhead")
    print(_report.format_report(explanations))
    return _writer.write(
        log_dir,
        explanations,
        model=args.model,
        data=args.data or "synthetic",
        device_kind=sweep.device_kind,
        scaling=sweep.scaling_mode,
    )
