"""What `ThroughputLogger` shows in TensorBoard besides its scalars: charts and text."""

import functools
import os

SCALAR_TAGS = frozenset(
    {
        "throughput/samples_per_sec",
        "throughput/steps_per_sec",
        "throughput/samples_per_sec_per_replica",
        "throughput/startup_time_s",
        "scaling/speedup",
        "scaling/efficiency",
        "scaling/ideal_speedup",
        "throughput/tflops_per_sec",
        "throughput/tflops_per_sec_per_replica",
        "throughput/mfu",
    }
)
SETUP_TAG = "throughput/setup"
ADVICE_TAG = "throughput/advice"


@functools.cache
def custom_scalars_layout():
    """The Custom Scalars dashboard: speedup within its ideal, efficiency, throughput.

    Speedup is a margin chart whose band reaches up to the ideal speedup, so
    the two cannot be confused at a glance; ideal has a chart of its own too.
    Built once per process (every run's is the same): do not modify it.
    """
    from tensorboard.plugins.custom_scalar import layout_pb2

    def lines(title, *tags):
        return layout_pb2.Chart(
            title=title,
            multiline=layout_pb2.MultilineChartContent(tag=[f"^{tag}$" for tag in tags]),
        )

    speedup_within_ideal = layout_pb2.Chart(
        title="speedup vs ideal (band up to ideal)",
        margin=layout_pb2.MarginChartContent(
            series=[
                layout_pb2.MarginChartContent.Series(
                    value="scaling/speedup",
                    lower="scaling/speedup",
                    upper="scaling/ideal_speedup",
                )
            ]
        ),
    )
    return layout_pb2.Layout(
        category=[
            layout_pb2.Category(
                title="scaling",
                chart=[
                    speedup_within_ideal,
                    lines("ideal speedup", "scaling/ideal_speedup"),
                    lines("efficiency", "scaling/efficiency"),
                    lines("samples/sec", "throughput/samples_per_sec"),
                    lines("model TFLOP/s", "throughput/tflops_per_sec"),
                    lines("MFU", "throughput/mfu"),
                ],
            )
        ]
    )


def path_for_display(path, log_dir):
    """`path` relative to `log_dir` when it lies inside it, else as given.

    A log tree that is copied or moved keeps naming the right file.

    Example: `path_for_display("/runs/a/one/throughput.json", "/runs/a")` is
    `"one/throughput.json"`.
    """
    path, log_dir = os.path.abspath(path), os.path.abspath(log_dir)
    if os.path.commonpath([path, log_dir]) == log_dir:
        return os.path.relpath(path, log_dir)
    return path


def setup_markdown(rows):
    """A two-column Markdown table of `(setting, value)`, rows without a value left out."""
    lines = ["| setting | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows if value not in (None, "")]
    return "\n".join(lines)


def baseline_text(baseline, log_dir):
    """The set-up table's description of a `keras_scaling.baseline.Baseline`, or None."""
    if baseline is None:
        return "none (no scaling/ tags)"
    if baseline.mode == "self":
        return baseline.source
    source = baseline.source
    if baseline.mode == "file":
        source = path_for_display(source, log_dir)
    return f"{baseline.samples_per_sec:.1f} samples/sec ({source})"


def points_text(update_freq):
    """When points are written, as the set-up table says it."""
    if update_freq != "auto":
        return f"every {update_freq} steps"
    return "every 10 steps, then as many as keep reading the counter under 0.1% of a step"
