"""`explain.json`, and the TensorBoard run `explain`: scalars stepped by replica count, Text."""

import json
import os

from keras_scaling.explain import _report, _split
from keras_scaling.summaries import _tensorboard

RUN = "explain"
_SERIES = _split.PARTS + ("rest",)


def scalars(explanation):
    """`{tag: value}` of one count's split."""
    record = explanation.record
    values = {"explain/step_ms": record["step_ms"], "explain/rest_ms": record["rest_ms"]}
    values["explain/rest_share"] = record["rest_share"]
    for name, part in record["parts"].items():
        values[f"explain/{name}_ms"] = part["ms"]
        values[f"explain/{name}_share"] = part["share"]
    return values


def custom_scalars_layout():
    """The Custom Scalars layout: the parts in ms and as shares, against replicas."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    def lines(title, unit, extra=()):
        tags = [f"^explain/{name}_{unit}$" for name in _SERIES + tuple(extra)]
        return layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(tag=tags))

    return layout_pb2.Layout(
        category=[
            layout_pb2.Category(
                title="explain: step split per replica count (x axis: replicas)",
                chart=[
                    lines("step and its parts, ms", "ms", extra=("step",)),
                    lines("share of the step", "share"),
                ],
            )
        ]
    )


def verdict_markdown(explanations):
    """The table and the verdicts, as Markdown for the Text tab."""
    table = _split.format_table([(item.record["replicas"], item.split) for item in explanations])
    lines = ["```", table, "```", ""]
    for item in explanations:
        lines.extend(f"- {line.strip()}" for line in _report.verdict_lines(item))
    return "\n".join(lines)


def write(log_dir, explanations, **setup):
    """Writes `log_dir/explain.json` and the run `log_dir/explain`; returns the json's path."""
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, _report.FILE_NAME)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(_report.to_json(explanations, **setup), file, indent=2)
        file.write("\n")
    _tensorboard.write_custom_scalars_layout(log_dir, custom_scalars_layout(), run=RUN)
    for item in explanations:
        _tensorboard.write_scalars(log_dir, item.record["replicas"], scalars(item), run=RUN)
    _tensorboard.write_text(log_dir, 0, "explain/verdict", verdict_markdown(explanations), run=RUN)
    _tensorboard.flush(log_dir, run=RUN)
    return path
