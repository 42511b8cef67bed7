"""The scaling table: one row of speedup and efficiency per `throughput.json`.

Speedup is over the 1-replica run when there is exactly one among the runs, otherwise
over each run's own recorded baseline, computed as `ThroughputLogger` computes it.
"""

import collections
import math
import os
import re

from keras_scaling.mfu import utilization
from keras_scaling.throughput import _run_record
from keras_scaling.tune._report import markdown_table

THROUGHPUT_FILE = _run_record.THROUGHPUT_JSON


# One `throughput.json`: `name` is its directory relative to the one searched ("." for itself).
Run = collections.namedtuple("Run", "name path throughput")
# The rows sorted by replicas then run; the common baseline (None: each run's own); notes.
Summary = collections.namedtuple("Summary", "rows baseline_samples_per_sec baseline_source notes")
# One line of the scaling table; figures that could not be measured are NaN or None.
Row = collections.namedtuple(
    "Row",
    "run replicas per_replica_batch_size global_batch_size samples_per_sec speedup efficiency "
    "ideal_speedup tflops_per_sec mfu",
    defaults=(None, None),
)


def read_run(path, name):
    """Reads one `throughput.json`; raises ValueError saying what is wrong."""
    throughput = _run_record.read_throughput_json(path, parameter="file")
    _run_record.measured_samples_per_sec(throughput, path, "the run was too short to measure")
    return Run(name=name, path=os.path.abspath(path), throughput=throughput)


def find_runs(log_dir):
    """`(runs sorted by name, one message per unreadable file)` of every `throughput.json` under `log_dir`."""
    runs, problems = [], []
    for directory, subdirectories, files in os.walk(log_dir):
        subdirectories.sort()
        if THROUGHPUT_FILE in files:
            try:
                path = os.path.join(directory, THROUGHPUT_FILE)
                runs.append(read_run(path, os.path.relpath(directory, log_dir)))
            except (OSError, ValueError) as error:
                problems.append(str(error))
    return sorted(runs, key=lambda run: _natural_key(run.name)), problems


def _natural_key(name):
    """Sorts `replicas_2` before `replicas_10`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def summarize(runs):
    """The `Summary` of `runs` (see the module docstring for the baseline)."""
    single = [run for run in runs if run.throughput["num_replicas"] == 1]
    notes = []
    common = single[0].throughput if len(single) == 1 else None
    if common is not None:
        source = f"the 1-replica run {single[0].name} ({common['samples_per_sec']:.1f} samples/sec)"
    else:
        source = "each run's own recorded baseline (see its throughput.json)"
        if single:
            notes.append(
                f"{len(single)} runs have 1 replica, so none is the common "
                "baseline; each run's speedup uses its own recorded baseline"
            )
    rows = []
    for run in runs:
        record = run.throughput
        replicas, samples_per_sec = int(record["num_replicas"]), float(record["samples_per_sec"])
        global_batch_size = int(record["global_batch_size"])
        figures = _run_record.speedup_of(record, common)
        if figures is None:
            notes.append(f"{run.name} has no baseline, so no speedup")
        flops = float(record.get("flops_per_sample") or 0)
        tflops_per_sec = (
            utilization.utilization(flops, samples_per_sec, replicas).tflops_per_sec
            if flops
            else None
        )
        per_replica = int(record.get("per_replica_batch_size") or global_batch_size // replicas)
        speedup, efficiency, ideal = (
            (figures.speedup, figures.efficiency, figures.ideal_speedup)
            if figures
            else [math.nan] * 3
        )
        rows.append(
            Row(run.name, replicas, per_replica, global_batch_size, samples_per_sec, speedup,
                efficiency, ideal, tflops_per_sec, record.get("mfu"))
        )  # fmt: skip
    rows.sort(key=lambda row: (row.replicas, _natural_key(row.run)))
    baseline = None if common is None else float(common["samples_per_sec"])
    return Summary(tuple(rows), baseline, source, tuple(notes))


def smallest_efficient_batch(rows, threshold=0.9):
    """`(smallest per-replica batch reaching threshold efficiency at the largest count or None, that count)`."""
    largest = max(row.replicas for row in rows)
    reaching = [
        row.per_replica_batch_size
        for row in rows
        if row.replicas == largest and row.efficiency >= threshold  # NaN is never >=
    ]
    return (min(reaching) if reaching else None), largest


def summary_to_json(summary, **setup):
    """The content of `scaling.json`: the set-up, the baseline and the rows, NaN as null."""
    rows = [
        {key: _nan_as_none(value) for key, value in row._asdict().items()} for row in summary.rows
    ]
    return {
        "version": 1,
        **setup,
        "baseline_samples_per_sec": summary.baseline_samples_per_sec,
        "baseline_source": summary.baseline_source,
        "rows": rows,
        "notes": list(summary.notes),
    }


def summary_text(summary):
    """The table, the baseline its speedup is over, and the notes, as the commands print them."""
    notes = "".join(f"\nNote: {note}." for note in summary.notes)
    return f"{format_table(summary.rows)}\n\nSpeedup over {summary.baseline_source}.{notes}"


_COLUMNS = (
    ("replicas", "{:d}", "replicas"),
    ("global batch", "{:d}", "global_batch_size"),
    ("samples/sec", "{:.1f}", "samples_per_sec"),
    ("speedup", "{:.2f}x", "speedup"),
    ("efficiency", "{:.2f}", "efficiency"),
    ("ideal", "{:g}x", "ideal_speedup"),
    ("model FLOP/s", "flops", "tflops_per_sec"),
    ("MFU", "{:.3f}", "mfu"),
    ("run", "{}", "run"),
)


def format_table(rows):
    """The Markdown table of `rows`: numbers right-aligned, `-` where there is no figure."""
    cells = [[title for title, _, _ in _COLUMNS]]
    cells += [[_cell(fmt, getattr(row, field)) for _, fmt, field in _COLUMNS] for row in rows]
    # Only the run's name is text, aligned left.
    return markdown_table(cells, range(len(_COLUMNS) - 1))


def _nan_as_none(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def _cell(fmt, value):
    if _nan_as_none(value) is None:
        return "-"
    if fmt == "flops":
        from keras_scaling.throughput._dashboard import flops_text_of

        return flops_text_of(value * 1e12, "/s")
    return fmt.format(value)
