"""The bench's plots: speedup against replicas, efficiency against per-replica batch."""

import io
import math


def scaling_plot_png(rows, title, by_batch=False):
    """Draws measured speedup and ideal speedup against replicas; returns PNG bytes.

    With `by_batch`, one line per per-replica batch. Uses matplotlib's object
    API with the Agg canvas, so it needs no display and leaves pyplot's
    global state alone.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.8), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    replicas = sorted({row.replicas for row in rows})
    axes.plot(replicas, replicas, linestyle="--", color="grey", label="ideal")
    measured = [row for row in rows if not math.isnan(row.speedup)]
    if by_batch:
        series = [
            (f"per-replica batch {batch}",
             [row for row in measured if row.per_replica_batch_size == batch])
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
                xytext=(0, 8),
                ha="center",
                fontsize=8,
                color=lines[0].get_color(),
            )
    axes.set_xticks(replicas)
    axes.set_xlabel("replicas")
    axes.set_ylabel("speedup over 1 replica (labels: efficiency)")
    axes.set_xlim(left=0)
    return _png(figure, axes, title, legend="upper left")


def efficiency_plot_png(rows, title, threshold=0.9):
    """Draws scaling efficiency against per-replica batch, a line per replica count.

    The dashed line marks `threshold`: where a per-replica batch keeps every
    device busy enough. Returns PNG bytes.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.8), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    batches = sorted({row.per_replica_batch_size for row in rows})
    for replicas in sorted({row.replicas for row in rows if row.replicas > 1}):
        points = sorted(
            (row.per_replica_batch_size, row.efficiency)
            for row in rows
            if row.replicas == replicas and not math.isnan(row.efficiency)
        )
        if points:
            axes.plot(*zip(*points), marker="o", label=f"{replicas} replicas")
    axes.axhline(threshold, linestyle="--", color="grey", label=f"{threshold:.0%}")
    axes.set_xscale("log", base=2)
    axes.set_xticks(batches, [str(batch) for batch in batches])
    axes.set_xlabel("per-replica batch")
    axes.set_ylabel("scaling efficiency")
    return _png(figure, axes, title, legend="lower right")


def _png(figure, axes, title, legend):
    """Titles the axes, starts them at 0, and returns the figure as PNG bytes."""
    axes.set_title(title, fontsize=10)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(loc=legend)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
