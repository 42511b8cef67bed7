"""The speedup table: one row of speedup and efficiency per `throughput.json` file.

`ThroughputLogger` writes `log_dir/throughput.json` at the end of training.
This module finds those files under a directory, and turns them into one row
per run: replicas, global batch, samples/sec, speedup, efficiency, ideal,
model TFLOP/s and MFU.

Speedup is samples/sec divided by the baseline's samples/sec. The baseline
is the 1-replica run among the runs when there is exactly one (so a bench
sweep that includes 1 replica compares every count to the 1-replica figure
it measured itself); otherwise each run's own: the speedup and efficiency
the speedup of its recorded `baseline_samples_per_sec` on its
`baseline_num_replicas`, and no speedup when it has none. Speedup, ideal
(replicas divided by the baseline's replicas) and efficiency (speedup divided
by ideal) come from `keras_scaling.baseline.speedup_of`, the function
`ThroughputLogger` uses for its record, so a run's row shows the figures its
logger wrote.
"""

import dataclasses
import math
import os
import re

from keras_scaling.mfu import utilization
from keras_scaling.throughput import _run_record

THROUGHPUT_FILE = _run_record.THROUGHPUT_JSON


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run's `throughput.json`.

    Args:
        name: the run's directory relative to the directory searched
            (`"replicas_2"`), or `"."` for the directory itself.
        path: the absolute path of the file.
        throughput: the parsed file.
    """

    name: str
    path: str
    throughput: dict


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the scaling table."""

    run: str
    replicas: int
    per_replica_batch_size: int
    global_batch_size: int
    samples_per_sec: float
    speedup: float
    efficiency: float
    ideal_speedup: float
    tflops_per_sec: float | None = None
    mfu: float | None = None

    def to_json(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Summary:
    """The scaling table and where its baseline came from.

    Args:
        rows: `Row`s sorted by replicas, then run name.
        baseline_samples_per_sec: the common baseline, or None when each row
            uses its run's own recorded baseline.
        baseline_source: a readable description of the baseline.
        notes: remarks for the reader, such as runs that had no baseline.
    """

    rows: tuple
    baseline_samples_per_sec: float | None
    baseline_source: str
    notes: tuple


def read_run(path, name):
    """Reads one `throughput.json`; raises ValueError saying what is wrong."""
    throughput = _run_record.read_throughput_json(path, parameter="file")
    _run_record.measured_samples_per_sec(throughput, path, "the run was too short to measure")
    return Run(name=name, path=os.path.abspath(path), throughput=throughput)


def find_runs(log_dir):
    """Every readable `throughput.json` under `log_dir`, recursively.

    Returns:
        `(runs, problems)`: the `Run`s sorted by name, and one message per
        file that could not be read.
    """
    runs, problems = [], []
    for directory, subdirectories, files in os.walk(log_dir):
        subdirectories.sort()
        if THROUGHPUT_FILE not in files:
            continue
        name = os.path.relpath(directory, log_dir)
        try:
            runs.append(read_run(os.path.join(directory, THROUGHPUT_FILE), name))
        except (OSError, ValueError) as error:
            problems.append(str(error))
    return sorted(runs, key=lambda run: _natural_key(run.name)), problems


def _natural_key(name):
    """Sorts `replicas_2` before `replicas_10`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def summarize(runs):
    """The scaling `Summary` of `runs` (see the module docstring for the rules)."""
    if not runs:
        raise ValueError("summarize needs at least one run")
    single = [run for run in runs if run.throughput["num_replicas"] == 1]
    notes = []
    if len(single) == 1:
        common_baseline = single[0].throughput
        source = (
            f"the 1-replica run {single[0].name} "
            f"({float(common_baseline['samples_per_sec']):.1f} samples/sec)"
        )
    else:
        common_baseline = None
        source = "each run's own recorded baseline (see its throughput.json)"
        if len(single) > 1:
            notes.append(
                f"{len(single)} runs have 1 replica, so none is the common "
                "baseline; each run's speedup uses its own recorded baseline"
            )
    rows = []
    for run in runs:
        record = run.throughput
        replicas = int(record["num_replicas"])
        samples_per_sec = float(record["samples_per_sec"])
        figures = _run_record.speedup_of(record, common_baseline)
        if figures is None:
            speedup = efficiency = ideal_speedup = math.nan
            notes.append(f"{run.name} has no baseline, so no speedup")
        else:
            speedup, efficiency = figures.speedup, figures.efficiency
            ideal_speedup = figures.ideal_speedup
        global_batch_size = int(record["global_batch_size"])
        tflops_per_sec = None
        if record.get("flops_per_sample"):
            tflops_per_sec = utilization.utilization(
                float(record["flops_per_sample"]), samples_per_sec, replicas
            ).tflops_per_sec
        rows.append(
            Row(
                run=run.name,
                replicas=replicas,
                per_replica_batch_size=int(
                    record.get("per_replica_batch_size") or global_batch_size // replicas
                ),
                global_batch_size=global_batch_size,
                samples_per_sec=samples_per_sec,
                speedup=speedup,
                efficiency=efficiency,
                ideal_speedup=ideal_speedup,
                tflops_per_sec=tflops_per_sec,
                mfu=record.get("mfu"),
            )
        )
    rows.sort(key=lambda row: (row.replicas, _natural_key(row.run)))
    return Summary(
        rows=tuple(rows),
        baseline_samples_per_sec=(
            None if common_baseline is None else float(common_baseline["samples_per_sec"])
        ),
        baseline_source=source,
        notes=tuple(notes),
    )


def smallest_efficient_batch(rows, threshold=0.9):
    """The smallest per-replica batch reaching `threshold` efficiency at the largest count.

    Args:
        rows: `Row`s of a sweep over per-replica batches and replica counts.
        threshold: float, the efficiency to reach.

    Returns:
        `(per_replica_batch_size or None, largest replica count)`.

    Example: rows at 2 replicas with efficiencies 70%, 88%, 93% at per-replica
    batches 16, 32, 64 give `(64, 2)`.
    """
    largest = max(row.replicas for row in rows)
    reaching = [
        row.per_replica_batch_size
        for row in rows
        if row.replicas == largest
        and not math.isnan(row.efficiency)
        and row.efficiency >= threshold
    ]
    return (min(reaching) if reaching else None), largest


def summary_to_json(summary, **setup):
    """The content of `scaling.json`: the set-up, the baseline and the rows.

    NaN (no speedup) is written as null.
    """

    def clean(value):
        if isinstance(value, float) and math.isnan(value):
            return None
        return value

    return {
        "version": 1,
        **setup,
        "baseline_samples_per_sec": summary.baseline_samples_per_sec,
        "baseline_source": summary.baseline_source,
        "rows": [
            {key: clean(value) for key, value in row.to_json().items()} for row in summary.rows
        ],
        "notes": list(summary.notes),
    }
