"""`keras-scaling bench`: the speedup table of your model over replica counts."""

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from keras_scaling.cli import _bench_worker, _models, _speedup_table, _sweep_plan
from keras_scaling.cli._arguments import positive_int
from keras_scaling.cli._chart import MatplotlibMissing
from keras_scaling.cli._errors import UsageError
from keras_scaling.cli._plot import efficiency_plot_png, scaling_plot_png
from keras_scaling.cli._table import format_table

_DEFAULT_PER_REPLICA_BATCH = 64
_DEFAULT_STEPS = 100
_LOG_TAIL_LINES = 25
_RUN_DIR = "replicas_{}"
_BATCH_DIR = "batch_{}"
_RUN_DIR_PATTERN = re.compile(r"(replicas|batch)_\d+")
_EFFICIENT = 0.9
_WORKER_LOG = "bench_worker.log"
_EXPLAIN_FILE = "explain.json"
_EXPLAIN_RUN = "explain"
# The run, under LOGDIR, that holds the sweep's table and plots.
SUMMARY_RUN = "summary"

_DESCRIPTION = """\
Train a model on synthetic data at several replica counts and print the
speedup over 1 replica, the scaling efficiency (speedup / replicas) and the
ideal (= replicas).

Each count runs in a process of its own with MirroredStrategy over the first
N GPUs, or over N logical CPUs with --cpu-devices, and trains with
keras_scaling.data.distribute and ThroughputLogger into LOGDIR/replicas_N.
Speedup is samples/sec divided by the 1-replica samples/sec measured in the
same sweep (when 1 is not swept, each count measures its own 1-replica
baseline). Weak scaling (the default) keeps the per-replica batch fixed;
--global-batch keeps the global batch fixed instead (strong scaling).

On logical CPUs every replica gets its own thread pool of
cores // (largest count) threads, so N replicas use N times the cores of
1 replica, like N devices; counts above the number of cores share cores
and their figures are not meaningful.

--model takes a preset (mlp, cnn, resnet50: ResNet50 on 32x32x3 inputs
with 10 classes) or package.module:function, a function without arguments
that returns a keras.Model with known input shapes. It is called inside
the strategy scope. If the model is not compiled the bench compiles it with
SGD and mean squared error (presets: sparse categorical cross-entropy).

The table shows model TFLOP/s (the FLOPs of one training sample, counted
once from the model's traced loss and gradients, times samples/sec) and MFU
(TFLOP/s over the peak of the replicas' devices: a datasheet figure for
known GPUs and TPUs, --peak-flops measure to time a matrix multiply on CPUs).

--per-replica-batch 16,32,64,128 sweeps per-replica batches: a table per
batch, LOGDIR/efficiency.png (efficiency against per-replica batch, a line
per replica count), and the smallest per-replica batch that reaches 90%
efficiency at the largest replica count. Runs go to LOGDIR/batch_B/replicas_N.

--explain splits each count's step into input, compute, synchronization
and host overhead (see keras_scaling.explain), prints the split with a
verdict and the fix, and writes LOGDIR/explain.json and the TensorBoard run
"explain". --data package.module:function trains (and explains) on your own
data instead of synthetic data: a function without arguments returning a
tf.data.Dataset of single samples, arrays (x, y) or a keras.utils.PyDataset,
wrapped by keras_scaling.data.distribute as training would.

Writes LOGDIR/scaling.json, LOGDIR/scaling.png, and the plots and the tables
into TensorBoard (tensorboard --logdir LOGDIR): the run "summary" holds them
(Images and Text tabs), and each count's figures are in the run
"replicas_N/scaling" (Time Series and Custom Scalars tabs). The plots need
matplotlib: pip install 'keras-scaling[plot]'; without it the bench writes
everything else and says so.
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
    parser.add_argument(
        "--replicas",
        metavar="LIST",
        help="replica counts, such as 1,2,4 (default: 1, then powers of two up to all devices)",
    )
    parser.add_argument(
        "--cpu-devices",
        type=positive_int,
        metavar="N",
        help="sweep over N logical CPUs instead of the GPUs",
    )
    parser.add_argument(
        "--model",
        default="mlp",
        metavar="PRESET|package.module:function",
        help=f"the model: {', '.join(_models.PRESETS)} or package.module:function (default: mlp)",
    )
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument(
        "--per-replica-batch",
        metavar="B[,B...]",
        help=f"weak scaling: each replica's batch (default {_DEFAULT_PER_REPLICA_BATCH}); "
        "several, such as 16,32,64,128, sweep per-replica batches",
    )
    batch.add_argument(
        "--global-batch",
        type=positive_int,
        metavar="G",
        help="strong scaling: the global batch, split over the replicas",
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=_DEFAULT_STEPS,
        metavar="S",
        help=f"training steps per replica count (default {_DEFAULT_STEPS})",
    )
    parser.add_argument(
        "--steps-per-execution",
        type=positive_int,
        default=1,
        metavar="K",
        help="steps per compiled call, for models the bench compiles (default 1)",
    )
    parser.add_argument(
        "--logdir",
        "--log-dir",
        dest="logdir",
        metavar="LOGDIR",
        help="where to write the logs (default: logs/bench-YYYYmmdd-HHMMSS)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results of an earlier bench in LOGDIR",
    )
    parser.add_argument(
        "--peak-flops",
        default="auto",
        metavar="auto|measure|FLOPS",
        help="peak FLOPs/sec of one replica's device for MFU: auto (a datasheet "
        "table of GPUs and TPUs), measure (time a matrix multiply on one device), "
        "or a number such as 312e12 (default auto)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the synthetic data (default 0)"
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="split each count's step into input, compute, synchronization and host "
        "overhead, with a verdict; writes LOGDIR/explain.json",
    )
    parser.add_argument(
        "--data",
        metavar="package.module:function",
        help="train on your own data: a function returning a tf.data.Dataset of "
        "samples, arrays (x, y) or a keras.utils.PyDataset (default: synthetic data)",
    )
    parser.set_defaults(run=run)
    return parser


@dataclasses.dataclass(frozen=True)
class _Sweep:
    """What the bench will run: counts, batch sizes, devices and thread pools."""

    points: list
    device_kind: str
    num_devices: int
    scaling_mode: str
    cpu_threads: _sweep_plan.CpuThreads | None = None

    @property
    def replica_counts(self):
        return sorted({point.replicas for point in self.points})

    @property
    def batch_sweep(self):
        """The per-replica batches swept, when there are several, else None."""
        batches = sorted({point.per_replica_batch_size for point in self.points})
        return batches if self.scaling_mode == "weak" and len(batches) > 1 else None

    def groups(self):
        """`(run directory prefix, points)` per per-replica batch swept."""
        if self.batch_sweep is None:
            return [("", self.points)]
        return [
            (
                _BATCH_DIR.format(batch) + "/",
                [point for point in self.points if point.per_replica_batch_size == batch],
            )
            for batch in self.batch_sweep
        ]


def run(args):
    """Runs the sweep of `args`; returns the exit status."""
    sweep = _plan_sweep(args)
    log_dir = _prepare_log_dir(args.logdir, args.overwrite)
    print(
        f"Bench: model {args.model}, {sweep.scaling_mode} scaling, {args.steps} steps per "
        f"count, replicas {', '.join(map(str, sweep.replica_counts))} on "
        f"{sweep.device_kind}"
    )
    if sweep.num_devices == 1 and not args.cpu_devices:
        print("Only one device: pass --cpu-devices N to sweep over N logical CPUs.")
    if sweep.cpu_threads is not None:
        print(sweep.cpu_threads.describe())
    print(f"Logs: {log_dir}", flush=True)

    summaries = []
    index = 0
    for prefix, points in sweep.groups():
        # The 1-replica count runs first; every later count's ThroughputLogger
        # takes its throughput.json as the baseline, so the table's speedup and
        # the logged one are the same figure.
        baseline = "auto" if any(point.replicas == 1 for point in points) else "measure"
        runs = []
        for point in points:
            index += 1
            run_or_status = _run_point(args, sweep, point, index, log_dir, baseline, prefix)
            if isinstance(run_or_status, int):
                return run_or_status
            runs.append(run_or_status)
            if point.replicas == 1:
                baseline = run_or_status.path
        summaries.append(_speedup_table.summarize(runs))

    tables = []
    for summary in summaries:
        table = format_table(summary.rows)
        print()
        if sweep.batch_sweep is not None:
            print(f"Per-replica batch {summary.rows[0].per_replica_batch_size}:")
        print(table)
        print(f"\nSpeedup over {summary.baseline_source}.")
        for note in summary.notes:
            print(f"Note: {note}.")
        tables.append(table)
    table = "\n\n".join(tables)
    summary = summaries[0] if len(summaries) == 1 else _combined(summaries)
    if sweep.batch_sweep is not None:
        print(f"\n{_efficient_batch_line(summary.rows)}")
    if sweep.cpu_threads is not None and sweep.cpu_threads.oversubscribed:
        cores = sweep.cpu_threads.cores
        print(
            f"WARNING: counts above {cores} replicas exceed the {cores} cores; "
            "their figures are not meaningful."
        )
    charts = _write_results(log_dir, summary, table, args, sweep)
    written = ["scaling.json", *charts]
    if args.explain:
        written.append(_explain(log_dir, summary, args, sweep))
    print(f"\nWrote {', '.join(os.path.join(log_dir, name) for name in written)}.")
    print(f"Open TensorBoard: tensorboard --logdir {shlex.quote(log_dir)}")
    return 0


def _plan_sweep(args):
    """Checks the arguments and plans the sweep; raises `UsageError`."""
    _models.check_spec(args.model)
    if args.data is not None:
        _models.check_data_spec(args.data)
    num_devices, device_kind = _count_devices(args.cpu_devices)
    if args.replicas is None:
        replica_counts = _sweep_plan.default_replica_counts(num_devices)
    else:
        replica_counts = _sweep_plan.parse_replica_counts(args.replicas)
        _sweep_plan.check_replica_counts(replica_counts, num_devices, device_kind)
    _check_peak_flops(args)
    if args.global_batch is None:
        batches = (
            _sweep_plan.parse_batch_sizes(args.per_replica_batch)
            if args.per_replica_batch
            else (_DEFAULT_PER_REPLICA_BATCH,)
        )
        points = [
            point
            for batch in batches
            for point in _sweep_plan.plan_batches(replica_counts, per_replica_batch_size=batch)
        ]
    else:
        points = _sweep_plan.plan_batches(replica_counts, global_batch_size=args.global_batch)
    cpu_threads = None
    if args.cpu_devices:
        cpu_threads = _sweep_plan.plan_cpu_threads(replica_counts, _sweep_plan.available_cores())
    return _Sweep(
        points=points,
        device_kind=device_kind,
        num_devices=num_devices,
        scaling_mode="strong" if args.global_batch else "weak",
        cpu_threads=cpu_threads,
    )


def _check_peak_flops(args):
    """Checks `--peak-flops`; keeps its text for the worker."""
    from keras_scaling.mfu import utilization

    value = args.peak_flops
    if value not in ("auto", "measure"):
        try:
            value = float(value)
        except ValueError:
            pass
    try:
        utilization.check_peak_flops(value, parameter="--peak-flops")
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None


def _combined(summaries):
    """One `Summary` of the rows of a sweep over per-replica batches."""
    rows = tuple(row for summary in summaries for row in summary.rows)
    return _speedup_table.Summary(
        rows=rows,
        baseline_samples_per_sec=None,
        baseline_source="the 1-replica run of each per-replica batch",
        notes=tuple(note for summary in summaries for note in summary.notes),
    )


def _efficient_batch_line(rows):
    batch, largest = _speedup_table.smallest_efficient_batch(rows, _EFFICIENT)
    if batch is None:
        tried = max(row.per_replica_batch_size for row in rows)
        return (
            f"No per-replica batch up to {tried} reaches an efficiency of {_EFFICIENT:.2f} "
            f"at {largest} replicas: try larger batches."
        )
    return (
        f"Smallest per-replica batch reaching an efficiency of {_EFFICIENT:.2f} at "
        f"{largest} replicas: {batch}."
    )


def _count_devices(cpu_devices):
    """`(number of devices, description)`: the logical CPUs asked for, or the GPUs."""
    if cpu_devices:
        return cpu_devices, f"{cpu_devices} logical CPU(s)"
    import tensorflow as tf

    gpus = len(tf.config.list_physical_devices("GPU"))
    if gpus:
        return gpus, f"{gpus} GPU(s)"
    return 1, "1 CPU, no GPU"


def _prepare_log_dir(log_dir, overwrite):
    if log_dir is None:
        log_dir = os.path.join("logs", time.strftime("bench-%Y%m%d-%H%M%S"))
    log_dir = os.path.abspath(log_dir)
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        raise UsageError(f"--logdir {log_dir!r} is a file; pass a directory")
    earlier = _earlier_results(log_dir)
    if earlier and not overwrite:
        raise UsageError(
            f"--logdir {log_dir!r} already holds bench results ({', '.join(earlier)}); "
            "pass a new directory, or --overwrite to replace them"
        )
    for name in earlier:
        path = os.path.join(log_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    from keras_scaling.summaries import _tensorboard

    try:
        return _tensorboard.check_log_dir(log_dir, parameter="--logdir", run=SUMMARY_RUN)
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None


def _earlier_results(log_dir):
    """The files and directories an earlier bench left in `log_dir`.

    `summary` (and `train`, where earlier versions wrote the summary) counts
    only beside a `scaling.json`: without one it may hold a user's own
    TensorBoard logs.
    """
    if not os.path.isdir(log_dir):
        return []
    names = set(os.listdir(log_dir))
    earlier = {
        name
        for name in names
        if _RUN_DIR_PATTERN.fullmatch(name)
        or name in ("scaling.json", "scaling.png", "efficiency.png", _EXPLAIN_FILE)
    }
    if "scaling.json" in names:
        earlier.update(names & {SUMMARY_RUN, "train", _EXPLAIN_RUN})
    return sorted(earlier)


def _run_point(args, sweep, point, index, log_dir, baseline, prefix=""):
    """Trains one count in a child process; returns its `Run`, or an exit status."""
    run_name = prefix + _RUN_DIR.format(point.replicas)
    run_dir = os.path.join(log_dir, run_name)
    os.makedirs(run_dir, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "keras_scaling.cli._bench_worker",
        f"--replicas={point.replicas}",
        f"--model={args.model}",
        f"--per-replica-batch={point.per_replica_batch_size}",
        f"--steps={args.steps}",
        f"--steps-per-execution={args.steps_per_execution}",
        f"--log-dir={run_dir}",
        f"--baseline={baseline}",
        f"--seed={args.seed}",
        f"--peak-flops={args.peak_flops}",
    ]
    if args.explain:
        command.append("--explain")
    if args.data is not None:
        command.append(f"--data={args.data}")
    if sweep.cpu_threads is not None:
        command += [
            "--cpu-devices",
            f"--intra-op-threads={sweep.cpu_threads.intra_op_threads()}",
            f"--inter-op-threads={sweep.cpu_threads.inter_op_threads(point.replicas)}",
        ]
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    log_path = os.path.join(run_dir, _WORKER_LOG)
    progress = _Progress(index, len(sweep.points), point, args.steps)
    start_s = time.perf_counter()
    # Both streams append to one file: the child's stderr directly, its other
    # stdout lines through the parent, which keeps only progress for itself.
    with open(log_path, "w", encoding="utf-8"):
        pass
    with open(log_path, "a", encoding="utf-8") as log:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        assert process.stdout is not None  # a pipe
        try:
            for line in process.stdout:
                if line.startswith(_bench_worker.PROGRESS_PREFIX):
                    done, steps = line[len(_bench_worker.PROGRESS_PREFIX) :].split()
                    progress.update(int(done), int(steps))
                else:
                    log.write(line)
                    log.flush()
            returncode = process.wait()
        except BaseException:
            _stop(process)
            progress.abort()
            raise
    elapsed_s = time.perf_counter() - start_s
    throughput_path = os.path.join(run_dir, _speedup_table.THROUGHPUT_FILE)
    if returncode == 0 and os.path.exists(throughput_path):
        try:
            run = _speedup_table.read_run(throughput_path, run_name)
        except ValueError as error:
            progress.abort()
            raise UsageError(
                f"the run with {point.replicas} replica(s) gave no throughput figure "
                f"({error}); pass more --steps than {args.steps}"
            ) from None
        samples_per_sec = run.throughput["samples_per_sec"]
        progress.finish(f"{samples_per_sec:.1f} samples/sec ({elapsed_s:.0f} s)")
        return run
    progress.abort()
    lines = _tail(log_path)
    usage = [
        line[len(_bench_worker.USAGE_PREFIX) :]
        for line in lines
        if line.startswith(_bench_worker.USAGE_PREFIX)
    ]
    if returncode == 2 and usage:
        raise UsageError(usage[-1])
    if returncode < 0:
        how = f"was killed by signal {-returncode}"
    elif returncode == 0:
        how = "wrote no throughput.json"
    else:
        how = f"failed with exit status {returncode}"
    print(
        f"keras-scaling bench: the run with {point.replicas} replica(s) {how}. "
        f"Last lines of {log_path}:\n" + "\n".join(f"  {line}" for line in lines),
        file=sys.stderr,
    )
    return 1


def _stop(process):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(path):
    with open(path, encoding="utf-8", errors="replace") as file:
        return [line.rstrip("\n") for line in file.readlines()[-_LOG_TAIL_LINES:]]


class _Progress:
    """One line per replica count: a bar on a terminal, start and end lines otherwise."""

    _WIDTH = 30

    def __init__(self, index, total, point, steps):
        self._interactive = sys.stdout.isatty()
        self._label = (
            f"[{index}/{total}] {point.replicas} replica(s), global batch {point.global_batch_size}"
        )
        self._last = ""
        if self._interactive:
            self._show(f"{self._label}: starting")
        else:
            print(f"{self._label}: training {steps} steps ...", flush=True)

    def update(self, done, steps):
        if not self._interactive:
            return
        filled = self._WIDTH * done // max(steps, 1)
        bar = "#" * filled + "-" * (self._WIDTH - filled)
        self._show(f"{self._label}  [{bar}] {done}/{steps} steps")

    def finish(self, text):
        if self._interactive:
            self._show(f"{self._label}: {text}")
            sys.stdout.write("\n")
        else:
            print(f"{self._label}: {text}")
        sys.stdout.flush()

    def abort(self):
        if self._interactive and self._last:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self._last = ""

    def _show(self, text):
        sys.stdout.write("\r" + text.ljust(len(self._last)))
        sys.stdout.flush()
        self._last = text


def _write_results(log_dir, summary, table, args, sweep):
    """scaling.json, the charts, and the charts and table in TensorBoard.

    Returns the names of the chart files written: none, with a message that
    says how to get them, when matplotlib is not installed.
    """
    from keras_scaling.summaries import _tensorboard

    title = f"{args.model}, {sweep.scaling_mode} scaling on {sweep.device_kind}"
    threads = sweep.cpu_threads
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
    if sweep.batch_sweep is not None:
        batch, _ = _speedup_table.smallest_efficient_batch(summary.rows, _EFFICIENT)
        setup["per_replica_batches"] = sweep.batch_sweep
        setup["smallest_efficient_per_replica_batch"] = batch
    with open(os.path.join(log_dir, "scaling.json"), "w", encoding="utf-8") as file:
        json.dump(_speedup_table.summary_to_json(summary, **setup), file, indent=2)
        file.write("\n")
    charts = [
        (
            "scaling.png",
            "scaling/speedup_vs_replicas",
            lambda: scaling_plot_png(summary.rows, title, by_batch=sweep.batch_sweep is not None),
        )
    ]
    if sweep.batch_sweep is not None:
        charts.append(
            (
                "efficiency.png",
                "scaling/efficiency_vs_per_replica_batch",
                lambda: efficiency_plot_png(summary.rows, title, _EFFICIENT),
            )
        )
    written = []
    for name, tag, draw in charts:
        try:
            png = draw()
        except MatplotlibMissing as error:
            print(f"\nNo charts ({', '.join(name for name, _, _ in charts)}): {error}.", flush=True)
            break
        with open(os.path.join(log_dir, name), "wb") as file:
            file.write(png)
        _tensorboard.write_image(log_dir, 0, tag, png, run=SUMMARY_RUN)
        written.append(name)
    text = f"{table}\n\nSpeedup over {summary.baseline_source}."
    if sweep.batch_sweep is not None:
        text += f"\n\n{_efficient_batch_line(summary.rows)}"
    _tensorboard.write_text(log_dir, 0, "scaling/table", text, run=SUMMARY_RUN)
    return written


def _explain(log_dir, summary, args, sweep):
    """Prints and writes the split of each count's step; returns explain.json's path."""
    from keras_scaling.explain import _report, _writer

    efficient_batch = None
    if sweep.batch_sweep is not None:
        efficient_batch, _ = _speedup_table.smallest_efficient_batch(summary.rows, _EFFICIENT)
    explanations = []
    for row in summary.rows:
        run_dir = os.path.join(log_dir, row.run)
        with open(os.path.join(run_dir, _bench_worker.EXPLAIN_FILE), encoding="utf-8") as file:
            measured = json.load(file)
        explanations.append(
            _report.explanation(
                measured["measurements"],
                mfu=measured["mfu"],
                mfu_reason=measured["mfu_reason"],
                efficient_per_replica_batch=efficient_batch,
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
