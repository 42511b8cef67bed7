"""What `tune` reports: the table of the trials, the outcome, `tune.json` and the table in TensorBoard."""

import json
import os

SCHEMA_VERSION = 1
FILE_NAME = "tune.json"
# The TensorBoard run, under the log directory, that holds the table.
RUN = "tune"
_COLUMNS = ("knob", "value", "samples/sec", "spread", "vs incumbent", "vs start", "kept", "why")


def _format(value, spec, before="", after=""):
    return "-" if value is None else f"{before}{value:{spec}}{after}"


def value_text(value):
    if isinstance(value, dict) and "n" in value:
        from keras_scaling.tune import _candidates

        return "pools " + _candidates.describe_cpu_threads(value)
    return value if isinstance(value, str) else json.dumps(value)


def trial_line(trial):
    """The line a measured trial prints when it ends."""
    return (
        f"  {trial['knob']}={value_text(trial['value'])}: {trial['samples_per_sec']:,.0f} "
        f"samples/sec, {trial['ratio_to_incumbent']:.2f}x the incumbent: "
        f"{'kept' if trial['kept'] else 'not kept'} ({trial['reason']})"
    )


def markdown_table(rows, right_aligned):
    """`rows` (the header first) as a Markdown table; columns in `right_aligned` are numbers."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    right = [column in right_aligned for column in range(len(widths))]
    rule = ["-" * (w - 1) + ":" if r else ":" + "-" * (w - 1) for w, r in zip(widths, right)]
    lines = [
        [cell.rjust(w) if r else cell.ljust(w) for cell, w, r in zip(row, widths, right)]
        for row in rows
    ]
    lines.insert(1, rule)
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def format_table(trials):
    """The trials as a Markdown table: one row per knob value tried or skipped."""
    rows = [list(_COLUMNS)]
    for trial in trials:
        rows.append(
            [
                trial["knob"],
                "-" if trial["value"] is None else value_text(trial["value"]),
                _format(trial["samples_per_sec"], ",.0f"),
                _format(trial["spread"], ".0%", before="±"),
                _format(trial["ratio_to_incumbent"], ".2f", after="x"),
                _format(trial["ratio_to_start"], ".2f", after="x"),
                "yes" if trial["kept"] else "no",
                trial["reason"],
            ]
        )
    return markdown_table(rows, {2, 3, 4, 5})


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
    start = _format(record["start"]["samples_per_sec"], ",.0f")
    best = record["best"]
    if best["settings"] == record["start"]["settings"]:
        lines = [f"Tune: nothing worth changing ({start} samples/sec at the start)."]
    else:
        lines = [
            f"Tune: {start} -> {_format(best['samples_per_sec'], ',.0f')} samples/sec, "
            f"{best['ratio_to_start']:.2f}x the start ({best['ratio_source']})."
        ]
    return lines + [f"  note: {note}" for note in record["notes"]]


def text(record, path=None):
    """The table, the outcome and, with `path`, the lines that apply it."""
    lines = [format_table(record["trials"]), "", *summary_lines(record)]
    if path is not None:
        lines += ["", "Apply it:", *(f"  {line}" for line in apply_lines(record, path))]
    return "\n".join(lines)


def write(log_dir, record):
    """Writes `log_dir/tune.json` and the table in the TensorBoard run `tune`; returns the path."""
    from keras_scaling.summaries import _tensorboard

    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, FILE_NAME)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(record, file, indent=2)
        file.write("\n")
    markdown = format_table(record["trials"]) + "\n\n"
    markdown += "\n".join(f"- {line.strip()}" for line in summary_lines(record))
    _tensorboard.write_text(log_dir, 0, "tune/table", markdown, run=RUN)
    _tensorboard.close(log_dir, run=RUN)
    return path
