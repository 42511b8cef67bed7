"""Line charts drawn with matplotlib: what a chart shows, and its PNG.

`Chart` holds what a chart shows (lines, point labels, axes, legend) and
nothing of how it is drawn. `render` draws it with matplotlib's Agg canvas
(no display, no pyplot state) into a 640 x 480 PNG and returns the PNG with
what the figure holds: each line's points as plotted, the y ticks matplotlib
chose, and the box of each text, so that tests check the picture's content
and layout, not only that a file exists.

matplotlib is the optional extra `keras-scaling[plot]`, imported only when a
chart is drawn: Keras imports `matplotlib.pyplot` whenever matplotlib is
installed, so it costs every `import keras` of its users. Without it,
`render` raises `MatplotlibMissing`, whose message says how to install it.

Sizes suit TensorBoard's image cards, which show an image about 300 pixels
wide: text 18 to 20 pixels high stays readable at half size.
"""

import dataclasses
import io
from typing import Any

import numpy as np

WIDTH_PX = 640
HEIGHT_PX = 480
FONT_PX = 20
SMALL_FONT_PX = 18
# matplotlib's default colour cycle ("tab10"), written out so that a user's
# matplotlibrc does not change the charts.
COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
)
GREY = "#808080"
PLOT_EXTRA = "pip install 'keras-scaling[plot]'"

_DPI = 100
_POINTS_PER_INCH = 72
_LINE_PX = 3
_MARKER_PX = 10
_POINT_LABEL_LIFT_PX = 9
_GRID = "#e2e2e2"
# At most 6 y ticks, on steps of 1, 2, 2.5 or 5 times a power of 10.
_Y_TICK_BINS = 5
_Y_TICK_STEPS = (1, 2, 2.5, 5, 10)


class MatplotlibMissing(ImportError):
    """matplotlib, which draws the charts, cannot be imported; the message says how to install it."""


@dataclasses.dataclass(frozen=True)
class Line:
    """A line through `points`, `((x, y), ...)`; `label` names it in the legend."""

    points: tuple
    color: str
    label: str = ""
    dashed: bool = False
    markers: bool = False


@dataclasses.dataclass(frozen=True)
class PointLabel:
    """`text` centred just above the point `(x, y)`."""

    text: str
    x: float
    y: float
    color: str


@dataclasses.dataclass(frozen=True)
class Chart:
    """What a chart shows.

    `x_ticks` are `((value, text), ...)`; matplotlib chooses the y ticks on
    round numbers of `y_range`. With `x_log2`, the x axis is logarithmic.
    `legend_at` is `"upper left"` or `"lower right"`, inside the axes.
    """

    title: str
    x_label: str
    y_label: str
    x_ticks: tuple
    x_range: tuple
    y_range: tuple
    lines: tuple = ()
    point_labels: tuple = ()
    x_log2: bool = False
    legend_at: str = "upper left"


@dataclasses.dataclass(frozen=True)
class PlacedText:
    """A text of a rendered chart: its `role`, its box `(left, top, right, bottom)` in pixels."""

    text: str
    role: str
    box: tuple
    size_px: float


@dataclasses.dataclass(frozen=True)
class PlottedLine:
    """A line as matplotlib plotted it: its legend `label` ("" if none) and `points`."""

    label: str
    points: tuple


@dataclasses.dataclass(frozen=True)
class Rendered:
    """A rendered chart: the PNG and what the figure holds.

    `axes_box` and each text's box are `(left, top, right, bottom)` in
    pixels of the PNG, from its top left corner; `lines` are read back from
    the figure's axes, `y_ticks` are the y ticks drawn.
    """

    png: bytes
    axes_box: tuple
    texts: tuple
    lines: tuple
    y_ticks: tuple


def render(chart):
    """Draws `chart` with matplotlib; returns a `Rendered` with a 640 x 480 PNG.

    Raises:
        MatplotlibMissing: matplotlib cannot be imported.
    """
    try:
        import matplotlib.style
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise MatplotlibMissing(
            f"matplotlib cannot be imported ({error}); {PLOT_EXTRA} draws the charts"
        ) from error

    # matplotlib's defaults, whatever the user's matplotlibrc says.
    with matplotlib.style.context("default"):
        figure = Figure(figsize=(WIDTH_PX / _DPI, HEIGHT_PX / _DPI), dpi=_DPI, layout="constrained")
        canvas = FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        _draw(chart, axes)
        canvas.draw()
        renderer = canvas.get_renderer()
        texts = _placed_texts(axes, renderer)
        buffer = io.BytesIO()
        # No matplotlib version in the metadata: the same chart gives the same bytes.
        figure.savefig(buffer, format="png", dpi=_DPI, metadata={"Software": None})
    return Rendered(
        png=buffer.getvalue(),
        axes_box=_box(axes.get_window_extent(renderer)),
        texts=texts,
        lines=tuple(_plotted_line(line) for line in axes.get_lines()),
        y_ticks=tuple(float(value) for value in _visible_ticks(axes.yaxis, axes.get_ylim())),
    )


def _plotted_line(line: Any) -> "PlottedLine":
    label = str(line.get_label())
    return PlottedLine(
        # matplotlib names the lines without a legend entry "_child0", ...
        label="" if label.startswith("_") else label,
        points=tuple((float(x), float(y)) for x, y in np.asarray(line.get_xydata())),
    )


def _points(size_px):
    """Font and line sizes are in points; ours are in pixels of the 100-dpi PNG."""
    return size_px * _POINTS_PER_INCH / _DPI


def _draw(chart, axes):
    from matplotlib import ticker

    for line in chart.lines:
        xs, ys = zip(*line.points) if line.points else ((), ())
        axes.plot(
            xs,
            ys,
            color=line.color,
            # matplotlib leaves labels starting with "_" out of the legend.
            label=line.label or "_unlabelled",
            linestyle="--" if line.dashed else "-",
            linewidth=_points(_LINE_PX),
            marker="o" if line.markers else None,
            markersize=_points(_MARKER_PX),
        )
    for label in chart.point_labels:
        axes.annotate(
            label.text,
            (label.x, label.y),
            xytext=(0, _points(_POINT_LABEL_LIFT_PX)),
            textcoords="offset points",
            ha="center",
            va="bottom",
            color=label.color,
            fontsize=_points(SMALL_FONT_PX),
        )
    axes.set_title(chart.title, fontsize=_points(FONT_PX))
    axes.set_xlabel(chart.x_label, fontsize=_points(FONT_PX))
    axes.set_ylabel(chart.y_label, fontsize=_points(FONT_PX))
    if chart.x_log2:
        axes.set_xscale("log", base=2)
    axes.set_xlim(*chart.x_range)
    axes.set_ylim(*chart.y_range)
    axes.set_xticks([value for value, _ in chart.x_ticks], [text for _, text in chart.x_ticks])
    axes.xaxis.set_minor_locator(ticker.NullLocator())
    axes.yaxis.set_major_locator(ticker.MaxNLocator(nbins=_Y_TICK_BINS, steps=_Y_TICK_STEPS))
    # 2 for 2.0, 0.25 for 0.25: as short as exact.
    axes.yaxis.set_major_formatter(ticker.StrMethodFormatter("{x:g}"))
    axes.tick_params(labelsize=_points(FONT_PX))
    axes.grid(True, color=_GRID)
    axes.set_axisbelow(True)
    if any(line.label for line in chart.lines):
        axes.legend(loc=chart.legend_at, fontsize=_points(SMALL_FONT_PX))


def _visible_ticks(axis, limits):
    low, high = sorted(limits)
    return [value for value in axis.get_majorticklocs() if low <= value <= high]


def _placed_texts(axes, renderer):
    """Every text drawn, with its role and box, after the figure is drawn."""
    low, high = sorted(axes.get_ylim())
    y_tick_labels = [
        text
        for value, text in zip(axes.yaxis.get_majorticklocs(), axes.get_yticklabels())
        if low <= value <= high
    ]
    roles = [
        ("title", [axes.title]),
        ("x label", [axes.xaxis.label]),
        ("y label", [axes.yaxis.label]),
        ("x tick", axes.get_xticklabels()),
        ("y tick", y_tick_labels),
        ("point label", axes.texts),
        ("legend", axes.get_legend().get_texts() if axes.get_legend() else []),
    ]
    return tuple(
        PlacedText(
            text=text.get_text(),
            role=role,
            box=_box(text.get_window_extent(renderer)),
            size_px=text.get_fontsize() * _DPI / _POINTS_PER_INCH,
        )
        for role, texts in roles
        for text in texts
        if text.get_visible() and text.get_text()
    )


def _box(bbox):
    """matplotlib's box (from the bottom left) as `(left, top, right, bottom)` from the top left."""
    return tuple(
        float(value) for value in (bbox.x0, HEIGHT_PX - bbox.y1, bbox.x1, HEIGHT_PX - bbox.y0)
    )
