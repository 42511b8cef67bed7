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
    values = {f"explain/{key}": record[key] for key in ("step_ms", "rest_ms", "rest_share")}
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

    charts = [lines("step and its parts, ms", "ms", ("step",)), lines("share of the step", "share")]
    title = "explain: step split per replica count (x axis: replicas)"
    return layout_pb2.Layout(category=[layout_pb2.Category(title=title, chart=charts)])


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
    verdicts = _report.format_report(explanations, markdown=True)
    _tensorboard.write_text(log_dir, 0, "explain/verdict", verdicts, run=RUN)
    _tensorboard.close(log_dir, run=RUN)
    return path
