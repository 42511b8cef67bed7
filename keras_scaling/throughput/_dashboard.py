"""What `ThroughputLogger` shows in TensorBoard besides its scalars: charts and text."""

import functools
import os

SCALAR_TAGS = frozenset(
    {"scaling/speedup", "scaling/efficiency", "scaling/ideal_speedup", "throughput/mfu"}
    | {
        f"throughput/{name}"
        for name in ("samples_per_sec", "steps_per_sec", "per_replica_samples_per_sec")
        + ("startup_time_s",)
    }
    # Model FLOP/s: GFLOP/s on CPUs, TFLOP/s on GPUs and TPUs.
    | {f"throughput/{per}{unit}flops_per_sec" for per in ("", "per_replica_") for unit in "gt"}
)
_SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"))

# The Text dashboard: the set-up in three short tables (TensorBoard gives a
# long one a scroll box of its own), and the advice.
SETUP_TAG = "throughput/setup"
BASELINE_TAG = "throughput/setup_baseline"
MEASURING_TAG = "throughput/setup_measuring"
ADVICE_TAG = "throughput/advice"


@functools.cache
def custom_scalars_layout(flops_tag=None, mfu=False):
    """The Custom Scalars layout: speedup against ideal, efficiency, throughput (cached: do not modify).

    Model FLOP/s only with a `flops_tag` (the tag in the device's unit), MFU only with `mfu`.
    """
    from tensorboard.plugins.custom_scalar import layout_pb2

    def lines(title, *tags):
        return layout_pb2.Chart(
            title=title,
            multiline=layout_pb2.MultilineChartContent(tag=[f"^{tag}$" for tag in tags]),
        )

    charts = [
        lines("speedup vs ideal", "scaling/speedup", "scaling/ideal_speedup"),
        lines("scaling efficiency (1.0 = perfect)", "scaling/efficiency"),
        lines("samples/sec", "throughput/samples_per_sec"),
    ]
    if flops_tag is not None:
        unit = "GFLOP/s" if "gflops" in flops_tag else "TFLOP/s"
        charts.append(lines(f"model {unit}", flops_tag))
    if mfu:
        charts.append(lines("MFU (1.0 = every device's peak)", "throughput/mfu"))
    return layout_pb2.Layout(category=[layout_pb2.Category(title="scaling", chart=charts)])


def path_for_display(path, log_dir):
    """`path` relative to `log_dir` when inside it (a moved log tree still names it), else as given."""
    path, log_dir = os.path.abspath(path), os.path.abspath(log_dir)
    if os.path.commonpath([path, log_dir]) == log_dir:
        return os.path.relpath(path, log_dir)
    return path


def setup_markdown(rows, heading="setting"):
    """A two-column Markdown table of `(name, value)`, rows without a value left out."""
    lines = [f"| {heading} | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows if value not in (None, "")]
    return "\n".join(lines)


_SETUP_LABELS = {
    "strategy": "strategy",
    "num_workers": "workers",
    "num_replicas": "replicas",
    "device_kind": "device kind",
    "per_replica_batch_size": "per-replica batch",
    "global_batch_size": "global batch",
    "dtype_policy": "dtype policy",
}


def setup_texts(
    setup, *, steps_per_execution, update_freq, warmup_steps, flops_rows, baseline, note, log_dir
):
    """The set-up as the Text dashboard shows it: `{tag: Markdown}` of three short tables."""
    run_rows = [(label, setup[key]) for key, label in _SETUP_LABELS.items()]
    every = f"every {update_freq} steps"
    if update_freq == "auto":
        every = (
            "at the end of every epoch and about 12 times a fit; in a long fit, "
            "as far apart as keeps measuring under 0.1% of the step time"
        )
    measuring_rows = [
        ("measured every", every),
        ("left out", f"the first execution of each fit and {warmup_steps} steps after it"),
        *flops_rows,
    ]
    took_s = getattr(baseline, "measure_time_s", None)
    took = None
    if took_s is not None:
        took = f"{took_s:.1f} s, timing a copy of the model alone before the first step"
    baseline_text = setup_markdown(
        [("measured against", _baseline_text(baseline, log_dir)), ("baseline took", took)],
        heading="speedup",
    )
    if note:
        baseline_text += f"\n\n{note[0].upper()}{note[1:]}"
    return {
        SETUP_TAG: setup_markdown([*run_rows, ("steps per execution", steps_per_execution)]),
        BASELINE_TAG: baseline_text,
        MEASURING_TAG: setup_markdown(measuring_rows, heading="measuring"),
    }


def _baseline_text(baseline, log_dir):
    if baseline is None:
        return "none (no scaling/ tags)"
    if baseline.mode == "self":
        return baseline.source
    source = baseline.source
    if baseline.mode == "file":
        source = path_for_display(source, log_dir)
    return f"{baseline.samples_per_sec:.1f} samples/sec ({source})"


def flops_text_of(flops, unit=""):
    """FLOPs (FLOP/s with `unit="/s"`) as read: "4,617 FLOPs", "3.10 GFLOPs", "312 TFLOP/s"."""
    noun = "FLOP" + (unit if unit else "s")
    for scale, prefix in _SI_PREFIXES:
        if flops >= scale:
            value = flops / scale
            digits = 0 if value >= 100 else 1 if value >= 10 else 2
            return f"{value:.{digits}f} {prefix}{noun}"
    return f"{flops:,.0f} {noun}"
