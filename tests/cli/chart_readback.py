"""What a chart `keras_scaling.cli._plot.render` draws holds, read back from the figure.

So that the tests check the picture, not only the file. Boxes are `(left, top,
right, bottom)` in pixels of the PNG from its top left corner; a line's label is
"" when it has no legend entry.
"""

import collections

import numpy as np

from keras_scaling.cli import _plot

PlacedText = collections.namedtuple("PlacedText", "text role box size_px")
PlottedLine = collections.namedtuple("PlottedLine", "label points")
Rendered = collections.namedtuple("Rendered", "png axes_box texts lines y_ticks")


def render(chart):
    """`_plot.render(chart)`, with what the figure holds: a `Rendered`."""
    png, (axes_box, texts, lines, y_ticks) = _plot.render(chart, inspect=_read)
    return Rendered(png, axes_box, texts, lines, y_ticks)


def _read(axes, renderer):
    lines = []
    for line in axes.get_lines():
        label = str(line.get_label())
        points = tuple((float(x), float(y)) for x, y in np.asarray(line.get_xydata()))
        # matplotlib names the lines without a legend entry "_child0", ...
        lines.append(PlottedLine("" if label.startswith("_") else label, points))
    y_ticks = tuple(float(value) for value, _ in _visible_y_ticks(axes))
    return (
        _box(axes.get_window_extent(renderer)),
        _placed_texts(axes, renderer),
        tuple(lines),
        y_ticks,
    )


def _visible_y_ticks(axes):
    """`(value, label)` of the y ticks inside the axes."""
    low, high = sorted(axes.get_ylim())
    ticks = zip(axes.yaxis.get_majorticklocs(), axes.get_yticklabels())
    return [(value, text) for value, text in ticks if low <= value <= high]


def _placed_texts(axes, renderer):
    legend = axes.get_legend()
    roles = [
        ("title", [axes.title]),
        ("x label", [axes.xaxis.label]),
        ("y label", [axes.yaxis.label]),
        ("x tick", axes.get_xticklabels()),
        ("y tick", [text for _, text in _visible_y_ticks(axes)]),
        ("point label", axes.texts),
        ("legend", legend.get_texts() if legend else []),
    ]
    return tuple(
        PlacedText(
            text=text.get_text(),
            role=role,
            box=_box(text.get_window_extent(renderer)),
            size_px=text.get_fontsize() * _plot.DPI / _plot.POINTS_PER_INCH,
        )
        for role, texts in roles
        for text in texts
        if text.get_visible() and text.get_text()
    )


def _box(bbox):
    """matplotlib's box (from the bottom left) as `(left, top, right, bottom)` from the top left."""
    height = _plot.HEIGHT_PX
    return tuple(float(value) for value in (bbox.x0, height - bbox.y1, bbox.x1, height - bbox.y0))
