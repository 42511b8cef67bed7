"""Throughput, speedup and scaling efficiency: `ThroughputLogger` and what it stands on.

The package's public names are the throughput arithmetic of
`keras_scaling.throughput.arithmetic` (numbers in, numbers out: measuring
windows, steady-state statistics, speedup, read spacing), gathered here as
in keras_scaling 0.1. The rest of the feature, each in a module of its own:

- `throughput_logger`: `ThroughputLogger`, the callback: a thin adapter that
  gathers step counts, samples and clock readings from Keras;
- `baseline`: the one-replica throughput that speedup is measured against,
  and the public names of the run record `throughput.json`;
- `_run_record`: the run record, built, validated, written and read;
- `_writer` and `_background_save`: the event file and `throughput.json`,
  written off `fit`'s loop, whatever way training stops;
- `_dashboard` and `_advice`: the charts, text and advice shown in TensorBoard;
- `_input_timing`: timing the input pipeline alone.

Model FLOPs and MFU are `keras_scaling.mfu`'s.
"""

from keras_scaling.throughput.arithmetic import (
    Interval,
    ReadSchedule,
    Speedup,
    SteadyState,
    ThroughputStats,
    ThroughputWindow,
    auto_update_freq,
    spacing_for_points,
    speedup,
    weighted_percentile,
)

__all__ = [
    "Interval",
    "ReadSchedule",
    "Speedup",
    "SteadyState",
    "ThroughputStats",
    "ThroughputWindow",
    "auto_update_freq",
    "spacing_for_points",
    "speedup",
    "weighted_percentile",
]
