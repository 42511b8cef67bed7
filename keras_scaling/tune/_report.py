"""What `tune` reports: the table of every knob tried, `tune.json`, and the table in TensorBoard.

Pure functions of the trials but for `write`. The schema of `tune.json` is
in docs/guides/tune.md.
"""

import json
import os

SCHEMA_VERSION = 1
FILE_NAME = "tune.json"
# The TensorBoard run, under the log directory, that holds the table.
RUN = "tune"
NOTHING_WORTH_CHANGING = "nothing worth changing"


def _rate(value):
    return "-" if value is None else f"{value:,.0f}"


def _ratio(value):
    return "-" if value is None else f"{value:.2f}x"


def _spread(value):
    return "-" if value is None else f"±{value:.0%}"


def _value(value):
    if isinstance(value, dict) and "n" in value:
        from keras_scaling.tune import _candidates

        return "pools " + _candidates.describe_cpu_threads(value)
    return json.dumps(value) if not isinstance(value, str) else value


_COLUMNS = ("knob", "value", "samples/sec", "spread", "vs incumbent", "vs start", "kept", "why")


def format_table(trials):
    """The trials as a Markdown table: one row per knob value tried or skipped."""
    rows = [list(_COLUMNS)]
    for trial in trials:
        rows.append(
            [
                trial["knob"],
                "-" if trial["value"] is None else _value(trial["value"]),
                _rate(trial["samples_per_sec"]),
                _spread(trial["spread"]),
                _ratio(trial["ratio_to_incumbent"]),
                _ratio(trial["ratio_to_start"]),
                "yes" if trial["kept"] else "no",
                trial["reason"],
            ]
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(_COLUMNS))]
    numeric = {2, 3, 4, 5}
    lines = []
    for index, row in enumerate(rows):
        cells = [
            cell.rjust(width) if column in numeric else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths))
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if index == 0:
            rules = [
                "-" * (width - 1) + ":" if column in numeric else ":" + "-" * (width - 1)
                for column, width in enumerate(widths)
            ]
            lines.append("| " + " | ".join(rules) + " |")
    return "\n".join(lines)


def apply_lines(record, path):
    """The lines that apply the best settings, in the user's code."""
    best = record["best"]["settings"]
    lines = [f'tuned = keras_scaling.tune.load("{path}")']
    if best.get("cpu"):
        lines.append("keras_scaling.use_logical_cpus(**tuned.cpu_kwargs)   # first in the process")
    if best["strategy"]:
        lines.append("strategy = keras_scaling.auto_strategy(**tuned.strategy_kwargs)")
    if best["data"]:
        lines.append(
            "train = keras_scaling.data.distribute(data, strategy=strategy, **tuned.data_kwargs)"
        )
    lines.append("model.compile(optimizer=..., loss=..., **tuned.compile_kwargs)")
    return lines


def summary_lines(record):
    """The outcome in words: the gain, or that nothing was worth changing, and the notes."""
    ratio = record["best"]["ratio_to_start"]
    start = record["start"]["samples_per_sec"]
    best = record["best"]["samples_per_sec"]
    if record["best"]["settings"] == record["start"]["settings"]:
        lines = [f"Tune: {NOTHING_WORTH_CHANGING} ({_rate(start)} samples/sec at the start)."]
    else:
        lines = [
            f"Tune: {_rate(start)} -> {_rate(best)} samples/sec, {ratio:.2f}x the start "
            f"({record['best']['ratio_source']})."
        ]
    lines.extend(f"  note: {note}" for note in record["notes"])
    return lines


def to_json(*, start, best, trials, notes, setup):
    """The content of `tune.json`."""
    return {
        "schema_version": SCHEMA_VERSION,
        **setup,
        "start": start,
        "best": best,
        "trials": trials,
        "notes": list(notes),
    }


def write(log_dir, record):
    """Writes `log_dir/tune.json` and the table as text in the TensorBoard run `tune`; returns the path."""
    from keras_scaling.summaries import _tensorboard

    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, FILE_NAME)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(record, file, indent=2)
        file.write("\n")
    markdown = "\n".join(
        [
            format_table(record["trials"]),
            "",
            *(f"- {line.strip()}" for line in summary_lines(record)),
        ]
    )
    _tensorboard.write_text(log_dir, 0, "tune/table", markdown, run=RUN)
    _tensorboard.flush(log_dir, run=RUN)
    return path
