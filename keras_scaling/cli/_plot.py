"""The bench's plots: speedup against replicas, efficiency against per-replica batch.

Both are drawn for TensorBoard's image cards, which show an image about 300
pixels wide: a small figure (4 x 3 inches) at a high resolution (640 x 480
pixels), so the text stays readable when the card scales the image down by
half, and still sharp at full size.
"""

import io
import math

_FIGURE_SIZE_IN = (4.0, 3.0)
_DPI = 160
_FONT_SIZE_PT = 9
# Room above the highest point and right of the last one, so the efficiency
# label of the last point stays inside the axes.
_HEADROOM = 1.2
_RIGHT_MARGIN = 0.12


def scaling_plot_png(rows, title, by_batch=False):
    """Draws measured speedup and ideal speedup against replicas; returns PNG bytes.

    The ideal of each run is the table's: its replicas over its baseline's
    replicas (the replicas themselves over a 1-replica baseline). Each
    measured point is labelled with its efficiency. With `by_batch`, one
    line per per-replica batch. Uses matplotlib's object API with the Agg
    canvas, so it needs no display and leaves pyplot's global state alone.

    Args:
        rows: the bench's `Row`s.
        title: str, the plot's title.
        by_batch: bool, a line per per-replica batch.

    Returns:
        bytes, a 640 x 480 PNG image.
    """
    return _png(scaling_figure(rows, title, by_batch))


def scaling_figure(rows, title, by_batch=False):
    """The matplotlib `Figure` that `scaling_plot_png` draws."""
    figure, axes = _figure()
    replicas = sorted({row.replicas for row in rows})
    # The ideal of each run is its replicas over its baseline's, as in the table.
    ideal = sorted(
        {(row.replicas, row.ideal_speedup) for row in rows if not math.isnan(row.ideal_speedup)}
    )
    over_one_replica = all(speedup == count for count, speedup in ideal)
    if ideal:
        axes.plot(
            [count for count, _ in ideal],
            [speedup for _, speedup in ideal],
            linestyle="--",
            color="grey",
            label="ideal (= replicas)" if over_one_replica else "ideal (replicas / baseline's)",
        )
    measured = [row for row in rows if not math.isnan(row.speedup)]
    if by_batch:
        series = [
            (
                f"per-replica batch {batch}",
                [row for row in measured if row.per_replica_batch_size == batch],
            )
            for batch in sorted({row.per_replica_batch_size for row in measured})
        ]
    else:
        series = [("measured", measured)] if measured else []
    for label, points in series:
        lines = axes.plot(
            [row.replicas for row in points],
            [row.speedup for row in points],
            marker="o",
            color=None if by_batch else "tab:blue",
            label=label,
        )
        for row in points:
            axes.annotate(
                f"{row.efficiency:.0%}",
                (row.replicas, row.speedup),
                textcoords="offset points",
                xytext=(0, 5),
                ha="center",
                fontsize=_FONT_SIZE_PT - 1,
                color=lines[0].get_color(),
            )
    highest = max([1] + [speedup for _, speedup in ideal] + [row.speedup for row in measured])
    axes.set_xticks(replicas)
    axes.set_xlim(0, max(replicas) * (1 + _RIGHT_MARGIN))
    axes.set_ylim(0, highest * _HEADROOM)
    axes.set_xlabel("replicas")
    axes.set_ylabel("speedup over 1 replica" if over_one_replica else "speedup over the baseline")
    _finish(axes, f"{title}\nlabels: scaling efficiency", legend="upper left")
    return figure


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
    """
    figure, axes = _figure()
    batches = sorted({row.per_replica_batch_size for row in rows})
    highest = threshold
    for replicas in sorted({row.replicas for row in rows if row.replicas > 1}):
        points = sorted(
            (row.per_replica_batch_size, row.efficiency)
            for row in rows
            if row.replicas == replicas and not math.isnan(row.efficiency)
        )
        if points:
            axes.plot(*zip(*points), marker="o", label=f"{replicas} replicas")
            highest = max([highest] + [efficiency for _, efficiency in points])
    axes.axhline(threshold, linestyle="--", color="grey", label=f"{threshold:.0%}")
    axes.set_xscale("log", base=2)
    axes.set_xticks(batches, [str(batch) for batch in batches])
    axes.set_ylim(0, highest * _HEADROOM)
    axes.set_xlabel("per-replica batch")
    axes.set_ylabel("scaling efficiency")
    _finish(axes, title, legend="lower right")
    return _png(figure)


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=_FIGURE_SIZE_IN, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.tick_params(labelsize=_FONT_SIZE_PT)
    return figure, axes


def _finish(axes, title, legend):
    axes.set_title(title, fontsize=_FONT_SIZE_PT)
    axes.xaxis.label.set_size(_FONT_SIZE_PT)
    axes.yaxis.label.set_size(_FONT_SIZE_PT)
    axes.grid(alpha=0.3)
    axes.legend(loc=legend, fontsize=_FONT_SIZE_PT - 1)


def _png(figure):
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
