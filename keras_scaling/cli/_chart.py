"""Line charts drawn with Pillow: what a chart shows, and its PNG.

`Chart` holds what a chart shows (lines, point labels, axes, legend) and
nothing of how it is drawn. `render` lays it out on a 640 x 480 canvas and
returns the PNG, with the box of each text it placed, so that the layout can
be checked. It draws at twice the size and scales down, so lines and text
are smooth.

Sizes suit TensorBoard's image cards, which show an image about 300 pixels
wide: text 18 to 20 pixels high stays readable at half size.
"""

import dataclasses
import io
import math

WIDTH_PX = 640
HEIGHT_PX = 480
FONT_PX = 20
SMALL_FONT_PX = 18
# matplotlib's default colours, so that the plots look as users expect.
COLORS = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (188, 189, 34),
    (23, 190, 207),
)
GREY = (128, 128, 128)

_SUPERSAMPLING = 2
_MARGIN_PX = 10
_GAP_PX = 6
_TICK_PX = 5
_LINE_PX = 3
_MARKER_RADIUS_PX = 5
_POINT_LABEL_LIFT_PX = 9
_DASH_PX = (10, 6)
_LEGEND_SAMPLE_PX = 28
_BLACK = (0, 0, 0)
_WHITE = (255, 255, 255)
_GRID = (226, 226, 226)
_LEGEND_EDGE = (204, 204, 204)


@dataclasses.dataclass(frozen=True)
class Line:
    """A line through `points`, `((x, y), ...)`; `label` names it in the legend."""

    points: tuple
    color: tuple
    label: str = ""
    dashed: bool = False
    markers: bool = False


@dataclasses.dataclass(frozen=True)
class PointLabel:
    """`text` centred just above the point `(x, y)`."""

    text: str
    x: float
    y: float
    color: tuple


@dataclasses.dataclass(frozen=True)
class Chart:
    """What a chart shows.

    `x_ticks` are `((value, text), ...)`; the y ticks are chosen to fall on
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
    size_px: int


@dataclasses.dataclass(frozen=True)
class Rendered:
    """A rendered chart: the PNG, the box of its axes, and every text placed."""

    png: bytes
    axes_box: tuple
    texts: tuple


def round_ticks(low, high, most=6):
    """Round values from `low` to `high`, at most `most` of them, a step of 1, 2, 2.5 or 5 times a power of 10."""
    span = high - low
    if not span > 0:
        return (low,)
    rough = span / (most - 1)
    power = 10.0 ** math.floor(math.log10(rough))
    step = next(power * m for m in (1, 2, 2.5, 5, 10) if power * m >= rough)
    first = math.ceil(low / step - 1e-9)
    last = math.floor(high / step + 1e-9)
    return tuple(round(i * step, 10) for i in range(first, last + 1))


def tick_text(value):
    """`2` for 2.0, `0.25` for 0.25: as short as exact."""
    return f"{value:g}"


def render(chart):
    """Draws `chart`; returns a `Rendered` with a 640 x 480 PNG."""
    from PIL import Image

    canvas = _Canvas()
    layout = _Layout(chart, canvas)
    layout.draw()
    image = canvas.image.resize((WIDTH_PX, HEIGHT_PX), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return Rendered(
        png=buffer.getvalue(),
        axes_box=tuple(value / _SUPERSAMPLING for value in layout.axes_box),
        texts=tuple(canvas.placed),
    )


class _Canvas:
    """A white image twice the size of the PNG; records where each text lands."""

    def __init__(self):
        from PIL import Image, ImageDraw, ImageFont

        self.image = Image.new(
            "RGB", (WIDTH_PX * _SUPERSAMPLING, HEIGHT_PX * _SUPERSAMPLING), _WHITE
        )
        self.draw = ImageDraw.Draw(self.image)
        self._fonts = {
            size: ImageFont.load_default(size=size * _SUPERSAMPLING)
            for size in (FONT_PX, SMALL_FONT_PX)
        }
        self.placed = []

    def text_size(self, text, size_px):
        left, top, right, bottom = self.draw.multiline_textbbox(
            (0, 0), text, font=self._fonts[size_px], anchor="la", align="center"
        )
        return right - left, bottom - top

    def text(self, at, text, size_px, anchor, role, color=_BLACK):
        font = self._fonts[size_px]
        self.draw.multiline_text(at, text, font=font, fill=color, anchor=anchor, align="center")
        box = self.draw.multiline_textbbox(at, text, font=font, anchor=anchor, align="center")
        self._place(text, role, box, size_px)

    def vertical_text(self, centre, text, size_px, role):
        """`text` turned a quarter left (read bottom to top), centred on `centre`."""
        from PIL import Image, ImageDraw

        font = self._fonts[size_px]
        left, top, right, bottom = self.draw.textbbox((0, 0), text, font=font, anchor="la")
        strip = Image.new("L", (int(right - left), int(bottom - top)), 0)
        ImageDraw.Draw(strip).text((-left, -top), text, font=font, fill=255, anchor="la")
        strip = strip.rotate(90, expand=True)
        corner = (round(centre[0] - strip.width / 2), round(centre[1] - strip.height / 2))
        self.image.paste(
            _BLACK, (*corner, corner[0] + strip.width, corner[1] + strip.height), strip
        )
        self._place(
            text,
            role,
            (corner[0], corner[1], corner[0] + strip.width, corner[1] + strip.height),
            size_px,
        )

    def _place(self, text, role, box, size_px):
        self.placed.append(
            PlacedText(
                text=text,
                role=role,
                box=tuple(value / _SUPERSAMPLING for value in box),
                size_px=size_px,
            )
        )


class _Layout:
    """Places the axes so that the title, labels and tick labels fit around them."""

    def __init__(self, chart, canvas):
        self.chart = chart
        self.canvas = canvas
        s = _SUPERSAMPLING
        self.y_ticks = round_ticks(*chart.y_range)
        _, title_height = canvas.text_size(chart.title, FONT_PX)
        _, x_label_height = canvas.text_size(chart.x_label, FONT_PX)
        y_tick_width = max(canvas.text_size(tick_text(v), FONT_PX)[0] for v in self.y_ticks)
        x_tick_height = max(
            [canvas.text_size(text, FONT_PX)[1] for _, text in chart.x_ticks] or [0]
        )
        # Turned a quarter, the y label is as wide as a line of text is high.
        _, self._y_label_width = canvas.text_size(chart.y_label, FONT_PX)
        last_x_tick_half = max(
            [canvas.text_size(text, FONT_PX)[0] / 2 for _, text in chart.x_ticks[-1:]] or [0]
        )
        left = (_MARGIN_PX + _GAP_PX + _TICK_PX + _GAP_PX) * s + self._y_label_width + y_tick_width
        top = (_MARGIN_PX + _GAP_PX) * s + title_height
        right = WIDTH_PX * s - _MARGIN_PX * s - last_x_tick_half
        bottom = (
            HEIGHT_PX * s
            - (_MARGIN_PX + _GAP_PX + _TICK_PX + _GAP_PX) * s
            - x_label_height
            - x_tick_height
        )
        self.axes_box = (round(left), round(top), round(right), round(bottom))

    def x(self, value):
        low, high = self.chart.x_range
        if self.chart.x_log2:
            value, low, high = math.log2(value), math.log2(low), math.log2(high)
        left, _, right, _ = self.axes_box
        return left + (value - low) / (high - low) * (right - left)

    def y(self, value):
        low, high = self.chart.y_range
        _, top, _, bottom = self.axes_box
        return bottom - (value - low) / (high - low) * (bottom - top)

    def draw(self):
        chart, canvas, draw = self.chart, self.canvas, self.canvas.draw
        s = _SUPERSAMPLING
        left, top, right, bottom = self.axes_box
        for value, _ in chart.x_ticks:
            draw.line([(self.x(value), top), (self.x(value), bottom)], fill=_GRID, width=s)
        for value in self.y_ticks:
            draw.line([(left, self.y(value)), (right, self.y(value))], fill=_GRID, width=s)
        for line in chart.lines:
            self._draw_line(line)
        for label in chart.point_labels:
            canvas.text(
                (self.x(label.x), self.y(label.y) - _POINT_LABEL_LIFT_PX * s),
                label.text,
                SMALL_FONT_PX,
                anchor="md",
                role="point label",
                color=label.color,
            )
        draw.rectangle([left, top, right, bottom], outline=_BLACK, width=s)
        for value, text in chart.x_ticks:
            x = self.x(value)
            draw.line([(x, bottom), (x, bottom + _TICK_PX * s)], fill=_BLACK, width=s)
            canvas.text(
                (x, bottom + (_TICK_PX + _GAP_PX) * s), text, FONT_PX, anchor="ma", role="x tick"
            )
        for value in self.y_ticks:
            y = self.y(value)
            draw.line([(left - _TICK_PX * s, y), (left, y)], fill=_BLACK, width=s)
            canvas.text(
                (left - (_TICK_PX + _GAP_PX) * s, y),
                tick_text(value),
                FONT_PX,
                anchor="rm",
                role="y tick",
            )
        canvas.text(
            ((left + right) / 2, HEIGHT_PX * s - _MARGIN_PX * s),
            chart.x_label,
            FONT_PX,
            anchor="md",
            role="x label",
        )
        canvas.vertical_text(
            (_MARGIN_PX * s + self._y_label_width / 2, (top + bottom) / 2),
            chart.y_label,
            FONT_PX,
            role="y label",
        )
        canvas.text(
            ((left + right) / 2, _MARGIN_PX * s), chart.title, FONT_PX, anchor="ma", role="title"
        )
        self._draw_legend()

    def _draw_line(self, line):
        points = [(self.x(x), self.y(y)) for x, y in line.points]
        self._stroke(points, line, markers_at=points)

    def _stroke(self, points, line, markers_at):
        """`points` joined in `line`'s style; its markers, if it has them, at `markers_at`."""
        draw, width = self.canvas.draw, _LINE_PX * _SUPERSAMPLING
        if line.dashed:
            for start, end in zip(points, points[1:]):
                _dashes(draw, start, end, line.color, width)
        elif len(points) > 1:
            draw.line(points, fill=line.color, width=width, joint="curve")
        if line.markers:
            radius = _MARKER_RADIUS_PX * _SUPERSAMPLING
            for x, y in markers_at:
                draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=line.color)

    def _draw_legend(self):
        entries = [line for line in self.chart.lines if line.label]
        if not entries:
            return
        s = _SUPERSAMPLING
        canvas = self.canvas
        pad, sample = _GAP_PX * s, _LEGEND_SAMPLE_PX * s
        sizes = [canvas.text_size(line.label, SMALL_FONT_PX) for line in entries]
        row_height = max(height for _, height in sizes) + _GAP_PX * s
        width = pad + sample + pad + max(width for width, _ in sizes) + pad
        height = pad + row_height * len(entries)
        left, top, right, bottom = self.axes_box
        if self.chart.legend_at == "upper left":
            corner = (left + pad, top + pad)
        else:
            corner = (right - pad - width, bottom - pad - height)
        canvas.draw.rectangle(
            [corner[0], corner[1], corner[0] + width, corner[1] + height],
            fill=_WHITE,
            outline=_LEGEND_EDGE,
            width=s,
        )
        for index, line in enumerate(entries):
            middle = corner[1] + pad + row_height * index + (row_height - _GAP_PX * s) / 2
            start, end = (corner[0] + pad, middle), (corner[0] + pad + sample, middle)
            self._stroke([start, end], line, markers_at=[((start[0] + end[0]) / 2, middle)])
            canvas.text(
                (end[0] + pad, middle), line.label, SMALL_FONT_PX, anchor="lm", role="legend"
            )


def _dashes(draw, start, end, color, width):
    """A dashed segment from `start` to `end`."""
    length = math.dist(start, end)
    if length == 0:
        return
    on, off = (value * _SUPERSAMPLING for value in _DASH_PX)
    unit = ((end[0] - start[0]) / length, (end[1] - start[1]) / length)
    position = 0.0
    while position < length:
        stop = min(position + on, length)
        draw.line(
            [
                (start[0] + unit[0] * position, start[1] + unit[1] * position),
                (start[0] + unit[0] * stop, start[1] + unit[1] * stop),
            ],
            fill=color,
            width=width,
        )
        position = stop + off
