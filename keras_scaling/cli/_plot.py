"""The scaling plot: measured speedup and the ideal line against replicas."""

import io
import math


def scaling_plot_png(rows, title):
    """Draws measured speedup and ideal speedup against replicas; returns PNG bytes.

    Uses matplotlib's object API with the Agg canvas, so it needs no display
    and leaves pyplot's global state alone.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.8), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    replicas = sorted({row.replicas for row in rows})
    axes.plot(replicas, replicas, linestyle="--", color="grey", label="ideal")
    measured = [row for row in rows if not math.isnan(row.speedup)]
    if measured:
        axes.plot(
            [row.replicas for row in measured],
            [row.speedup for row in measured],
            marker="o",
            color="tab:blue",
            label="measured",
        )
        for row in measured:
            axes.annotate(
                f"{row.efficiency:.0%}",
                (row.replicas, row.speedup),
                textcoords="offset points",
                xytext=(0, 8),
                ha="center",
                fontsize=8,
            )
    axes.set_xticks(replicas)
    axes.set_xlabel("replicas")
    axes.set_ylabel("speedup over 1 replica (labels: efficiency)")
    axes.set_title(title, fontsize=10)
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
