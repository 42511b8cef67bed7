"""The bench's charts, drawn with matplotlib, imported only then."""

import collections
import io
import math

WIDTH_PX = 640
HEIGHT_PX = 480
FONT_PX = 20
SMALL_FONT_PX = 18
# matplotlib's "tab10", written out so that a user's matplotlibrc does not change the charts.
COLORS = tuple("#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd #8c564b #e377c2 #bcbd22 #17becf".split())
GREY = "#808080"
DPI = 100
POINTS_PER_INCH = 72
# Room above the highest point and right of the last one, for the point labels.
_HEADROOM = 1.2
_RIGHT_MARGIN = 0.12


class MatplotlibMissing(ImportError):
    """matplotlib cannot be imported; the message says how to install it."""


# What a chart shows: lines through points `((x, y), ...)`, labelled in the
# legend when `label` is set; `PointLabel`s centred just above their point;
# x ticks `((value, text), ...)`, while matplotlib picks round y ticks.
Line = collections.namedtuple(
    "Line", "points color label dashed markers", defaults=("", False, False)
)
PointLabel = collections.namedtuple("PointLabel", "text x y color")
Chart = collections.namedtuple(
    "Chart",
    "title x_label y_label x_ticks x_range y_range lines point_labels x_log2 legend_at",
    defaults=((), (), False, "upper left"),
)


def scaling_plot_png(rows, title, by_batch=False):
    """The PNG of `scaling_chart`; raises `MatplotlibMissing`."""
    return render(scaling_chart(rows, title, by_batch))[0]


def efficiency_plot_png(rows, title, threshold=0.9):
    """The PNG of `efficiency_chart`; raises `MatplotlibMissing`."""
    return render(efficiency_chart(rows, title, threshold))[0]


def scaling_chart(rows, title, by_batch=False):
    """Speedup (points labelled with their efficiency) and the table's ideal against replicas; with `by_batch`, a line per batch."""
    ideal = sorted(
        {(row.replicas, row.ideal_speedup) for row in rows if not math.isnan(row.ideal_speedup)}
    )
    over_one_replica = all(speedup == count for count, speedup in ideal)
    lines, point_labels = [], []
    if ideal:
        label = "ideal (= replicas)" if over_one_replica else "ideal (replicas / baseline's)"
        lines.append(Line(tuple(ideal), GREY, label, dashed=True))
    measured = [row for row in rows if not math.isnan(row.speedup)]
    batches = sorted({row.per_replica_batch_size if by_batch else 0 for row in measured})
    for index, batch in enumerate(batches):
        points = [r for r in measured if not by_batch or r.per_replica_batch_size == batch]
        color = COLORS[index % len(COLORS)]
        label = f"per-replica batch {batch}" if by_batch else "measured"
        lines.append(
            Line(tuple((r.replicas, r.speedup) for r in points), color, label, markers=True)
        )
        point_labels += [
            PointLabel(f"{r.efficiency:.2f}", r.replicas, r.speedup, color) for r in points
        ]
    replicas = sorted({row.replicas for row in rows})
    highest = max([1] + [speedup for _, speedup in ideal] + [row.speedup for row in measured])
    return Chart(
        title=f"{title}\nlabels: scaling efficiency",
        x_label="replicas",
        y_label=f"speedup over {'1 replica' if over_one_replica else 'the baseline'} (×)",
        x_ticks=tuple((count, str(count)) for count in replicas),
        x_range=(0, max(replicas) * (1 + _RIGHT_MARGIN)),
        y_range=(0, highest * _HEADROOM),
        lines=tuple(lines),
        point_labels=tuple(point_labels),
    )


def efficiency_chart(rows, title, threshold=0.9):
    """Efficiency against per-replica batch, a line per replica count, a dashed line at `threshold`."""
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
            color = COLORS[index % len(COLORS)]
            lines.append(Line(tuple(points), color, f"{replicas} replicas", markers=True))
            highest = max([highest] + [efficiency for _, efficiency in points])
    threshold_points = ((x_range[0], threshold), (x_range[1], threshold))
    lines.append(Line(threshold_points, GREY, f"{threshold:.2f}", dashed=True))
    return Chart(
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


def render(chart, inspect=None):
    """Draws `chart` into a 640 x 480 PNG: `(png, inspect(axes, renderer) or None)`. Raises `MatplotlibMissing`."""
    try:
        import matplotlib.style
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise MatplotlibMissing(
            f"matplotlib cannot be imported ({error}); pip install 'keras-scaling[plot]' "
            "draws the charts"
        ) from error

    # matplotlib's defaults, whatever the user's matplotlibrc says, with our sizes.
    style = {
        **{f"{key}size": _points(FONT_PX) for key in ("axes.title", "axes.label", "xtick.label")},
        "ytick.labelsize": _points(FONT_PX),
        "legend.fontsize": _points(SMALL_FONT_PX),
        "lines.linewidth": _points(3),
        "lines.markersize": _points(10),
        "axes.grid": True,
        "axes.axisbelow": True,
        "grid.color": "#e2e2e2",
    }
    with matplotlib.style.context(["default", style]):
        figure = Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, layout="constrained")
        canvas = FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        _draw(chart, axes)
        canvas.draw()
        inspected = inspect(axes, canvas.get_renderer()) if inspect else None
        buffer = io.BytesIO()
        # No matplotlib version in the metadata: the same chart gives the same bytes.
        figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue(), inspected


def _points(size_px):
    """Font and line sizes are in points; ours are in pixels of the 100-dpi PNG."""
    return size_px * POINTS_PER_INCH / DPI


def _draw(chart, axes):
    from matplotlib import ticker

    for line in chart.lines:
        xs, ys = zip(*line.points) if line.points else ((), ())
        # matplotlib leaves labels starting with "_" out of the legend.
        label = line.label or "_unlabelled"
        style = ("--" if line.dashed else "-") + ("o" if line.markers else "")
        axes.plot(xs, ys, style, color=line.color, label=label)
    for label in chart.point_labels:
        axes.annotate(
            label.text,
            (label.x, label.y),
            xytext=(0, _points(9)),
            textcoords="offset points",
            ha="center",
            va="bottom",
            color=label.color,
            fontsize=_points(SMALL_FONT_PX),
        )
    axes.set(title=chart.title, xlabel=chart.x_label, ylabel=chart.y_label)
    if chart.x_log2:
        axes.set_xscale("log", base=2)
    axes.set_xlim(*chart.x_range)
    axes.set_ylim(*chart.y_range)
    axes.set_xticks([value for value, _ in chart.x_ticks], [text for _, text in chart.x_ticks])
    axes.xaxis.set_minor_locator(ticker.NullLocator())
    # At most 6 y ticks, on steps of 1, 2, 2.5 or 5 times a power of 10, written as short as exact.
    axes.yaxis.set_major_locator(ticker.MaxNLocator(nbins=5, steps=(1, 2, 2.5, 5, 10)))
    axes.yaxis.set_major_formatter(ticker.StrMethodFormatter("{x:g}"))
    if any(line.label for line in chart.lines):
        axes.legend(loc=chart.legend_at)
