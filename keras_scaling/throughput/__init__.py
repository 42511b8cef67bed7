"""Throughput, speedup and scaling efficiency: `ThroughputLogger` and what it stands on.

The package's public names are the throughput arithmetic of
`keras_scaling.throughput.arithmetic`, gathered here as in keras_scaling 0.1;
`throughput_logger` holds the callback, `baseline` the baselines and the
public names of `throughput.json`.
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
