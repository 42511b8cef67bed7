"""The bench's plots: speedup against replicas, efficiency against per-replica batch.

Each is a `_chart.Chart` (what it shows, testable as data), drawn with
matplotlib by `_chart.render` into a 640 x 480 PNG for `scaling.png`,
`efficiency.png` and TensorBoard's image cards. Without matplotlib (the extra
`keras-scaling[plot]`) the `*_png` functions raise `_chart.MatplotlibMissing`.
"""

import math

from keras_scaling.cli import _chart

# Room above the highest point and right of the last one, so the efficiency
# label of the last point stays inside the axes.
_HEADROOM = 1.2
_RIGHT_MARGIN = 0.12


def scaling_plot_png(rows, title, by_batch=False):
    """Draws measured speedup and ideal speedup against replicas; returns PNG bytes.

    Args:
        rows: the bench's `Row`s.
        title: str, the plot's title.
        by_batch: bool, a line per per-replica batch.

    Returns:
        bytes, a 640 x 480 PNG image.

    Raises:
        _chart.MatplotlibMissing: matplotlib cannot be imported.
    """
    return _chart.render(scaling_chart(rows, title, by_batch)).png


def scaling_chart(rows, title, by_batch=False):
    """The `Chart` that `scaling_plot_png` draws.

    The ideal of each run is the table's: its replicas over its baseline's
    replicas (the replicas themselves over a 1-replica baseline). Each
    measured point is labelled with its efficiency. With `by_batch`, one
    line per per-replica batch.
    """
    replicas = sorted({row.replicas for row in rows})
    ideal = sorted(
        {(row.replicas, row.ideal_speedup) for row in rows if not math.isnan(row.ideal_speedup)}
    )
    over_one_replica = all(speedup == count for count, speedup in ideal)
    lines: list[_chart.Line] = []
    point_labels: list[_chart.PointLabel] = []
    if ideal:
        lines.append(
            _chart.Line(
                points=tuple(ideal),
                color=_chart.GREY,
                label="ideal (= replicas)" if over_one_replica else "ideal (replicas / baseline's)",
                dashed=True,
            )
        )
    measured = [row for row in rows if not math.isnan(row.speedup)]
    if by_batch:
        batches = sorted({row.per_replica_batch_size for row in measured})
        series = [
            (
                f"per-replica batch {batch}",
                [row for row in measured if row.per_replica_batch_size == batch],
            )
            for batch in batches
        ]
    else:
        series = [("measured", measured)] if measured else []
    for index, (label, points) in enumerate(series):
        color = _chart.COLORS[index % len(_chart.COLORS)]
        lines.append(
            _chart.Line(
                points=tuple((row.replicas, row.speedup) for row in points),
                color=color,
                label=label,
                markers=True,
            )
        )
        point_labels.extend(
            _chart.PointLabel(f"{row.efficiency:.2f}", row.replicas, row.speedup, color)
            for row in points
        )
    highest = max([1] + [speedup for _, speedup in ideal] + [row.speedup for row in measured])
    return _chart.Chart(
        title=f"{title}\nlabels: scaling efficiency",
        x_label="replicas",
        y_label=f"speedup over {'1 replica' if over_one_replica else 'the baseline'} (×)",
        x_ticks=tuple((count, str(count)) for count in replicas),
        x_range=(0, max(replicas) * (1 + _RIGHT_MARGIN)),
        y_range=(0, highest * _HEADROOM),
        lines=tuple(lines),
        point_labels=tuple(point_labels),
        legend_at="upper left",
    )


def efficiency_plot_png(rows, title, threshold=0.9):
    """Draws scaling efficiency against per-replica batch, a line per replica count.

    The dashed line marks `threshold`: where a per-replica batch keeps every
    device busy enough.

    Args:
        rows: the bench's `Row`s.
        title: str, the plot's title.
        threshold: float, the efficiency to mark.

    Returns:
        bytes, a 640 x 480 PNG image.

    Raises:
        _chart.MatplotlibMissing: matplotlib cannot be imported.
    """
    return _chart.render(efficiency_chart(rows, title, threshold)).png


def efficiency_chart(rows, title, threshold=0.9):
    """The `Chart` that `efficiency_plot_png` draws."""
    batches = sorted({row.per_replica_batch_size for row in rows})
    # Half a doubling of room on each side of the logarithmic axis.
    x_range = (batches[0] / math.sqrt(2), batches[-1] * math.sqrt(2))
    lines, highest = [], threshold
    counts = sorted({row.replicas for row in rows if row.replicas > 1})
    for index, replicas in enumerate(counts):
        points = sorted(
            (row.per_replica_batch_size, row.efficiency)
            for row in rows
            if row.replicas == replicas and not math.isnan(row.efficiency)
        )
        if points:
            lines.append(
                _chart.Line(
                    points=tuple(points),
                    color=_chart.COLORS[index % len(_chart.COLORS)],
                    label=f"{replicas} replicas",
                    markers=True,
                )
            )
            highest = max([highest] + [efficiency for _, efficiency in points])
    lines.append(
        _chart.Line(
            points=((x_range[0], threshold), (x_range[1], threshold)),
            color=_chart.GREY,
            label=f"{threshold:.2f}",
            dashed=True,
        )
    )
    return _chart.Chart(
        title=title,
        x_label="per-replica batch (samples)",
        y_label="scaling efficiency (1 = ideal)",
        x_ticks=tuple((batch, str(batch)) for batch in batches),
        x_range=x_range,
        y_range=(0, highest * _HEADROOM),
        lines=tuple(lines),
        x_log2=True,
        legend_at="lower right",
    )
