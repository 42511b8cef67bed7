"""The bench's charts, drawn with matplotlib: what they plot, their ticks, their PNG.

The charts are read back from the figure `_plot.render` drew (the points of
each line, the ticks, the box of each text) and from the PNG it wrote.
"""

import io
import sys

import chart_readback
import pytest

from keras_scaling.cli import _plot, _speedup_table

pytestmark = pytest.mark.usefixtures("matplotlib_importable")


def _row(replicas, batch, efficiency):
    return _speedup_table.Row(
        run=f"batch_{batch}/replicas_{replicas}",
        replicas=replicas,
        per_replica_batch_size=batch,
        global_batch_size=batch * replicas,
        samples_per_sec=100.0 * replicas * efficiency,
        speedup=replicas * efficiency,
        efficiency=efficiency,
        ideal_speedup=float(replicas),
    )


def _batch_sweep_rows():
    return [
        _row(replicas, batch, efficiency)
        for replicas, batch, efficiency in [
            (1, 8, 1.0),
            (2, 8, 0.6),
            (4, 8, 0.4),
            (1, 32, 1.0),
            (2, 32, 0.95),
            (4, 32, 0.8),
        ]
    ]


def _read_png(png):
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(png), format="png")


def test_the_scaling_chart_plots_the_measured_speedups_and_the_ideal():
    rows = [_row(1, 32, 1.0), _row(2, 32, 0.93), _row(4, 32, 0.81), _row(8, 32, 0.7)]

    rendered = chart_readback.render(_plot.scaling_chart(rows, "mlp"))

    assert [(line.label, line.points) for line in rendered.lines] == [
        ("ideal (= replicas)", ((1, 1.0), (2, 2.0), (4, 4.0), (8, 8.0))),
        ("measured", tuple((row.replicas, row.speedup) for row in rows)),
    ]
    labels = [text.text for text in rendered.texts if text.role == "point label"]
    assert labels == ["1.00", "0.93", "0.81", "0.70"]  # each point's efficiency
    texts = {text.role: text.text for text in rendered.texts}
    assert texts["x label"] == "replicas"
    assert texts["y label"] == "speedup over 1 replica (×)"
    assert texts["title"] == "mlp\nlabels: scaling efficiency"


def test_the_scaling_chart_of_a_batch_sweep_plots_a_line_per_per_replica_batch():
    rows = _batch_sweep_rows()

    rendered = chart_readback.render(_plot.scaling_chart(rows, "mlp", by_batch=True))

    assert [(line.label, line.points) for line in rendered.lines] == [
        ("ideal (= replicas)", ((1, 1.0), (2, 2.0), (4, 4.0))),
        ("per-replica batch 8", ((1, 1.0), (2, 1.2), (4, 1.6))),
        ("per-replica batch 32", ((1, 1.0), (2, 1.9), (4, 3.2))),
    ]
    legend = [text.text for text in rendered.texts if text.role == "legend"]
    assert legend == ["ideal (= replicas)", "per-replica batch 8", "per-replica batch 32"]


def test_the_efficiency_chart_has_a_line_per_replica_count_and_the_threshold_across():
    chart = _plot.efficiency_chart(_batch_sweep_rows(), "mlp", threshold=0.9)

    assert [(line.label, line.points) for line in chart.lines] == [
        ("2 replicas", ((8, 0.6), (32, 0.95))),
        ("4 replicas", ((8, 0.4), (32, 0.8))),
        ("0.90", ((chart.x_range[0], 0.9), (chart.x_range[1], 0.9))),
    ]
    assert chart.x_log2 and chart.x_ticks == ((8, "8"), (32, "32"))
    assert chart.x_range[0] < 8 and 32 < chart.x_range[1]
    assert chart.y_range == (0, pytest.approx(0.95 * 1.2))


def test_the_efficiency_chart_plots_the_measured_efficiencies():
    rendered = chart_readback.render(
        _plot.efficiency_chart(_batch_sweep_rows(), "mlp", threshold=0.9)
    )

    by_label = {line.label: line.points for line in rendered.lines}
    assert by_label["2 replicas"] == ((8, 0.6), (32, 0.95))
    assert by_label["4 replicas"] == ((8, 0.4), (32, 0.8))
    assert {y for _, y in by_label["0.90"]} == {0.9}
    texts = {text.role: text.text for text in rendered.texts}
    assert texts["x label"] == "per-replica batch (samples)"
    assert texts["y label"] == "scaling efficiency (1 = ideal)"


@pytest.mark.parametrize(
    "replicas, efficiency, ticks",
    [
        (8, 1.0, (0, 2, 4, 6, 8)),  # the y axis reaches 9.6
        (2, 1.9, (0, 1, 2, 3, 4)),  # 4.56: superlinear
        (100, 1.0, (0, 25, 50, 75, 100)),  # 120
    ],
)
def test_y_ticks_fall_on_round_numbers(replicas, efficiency, ticks):
    rows = [_row(1, 32, 1.0), _row(replicas, 32, efficiency)]

    rendered = chart_readback.render(_plot.scaling_chart(rows, "mlp"))

    assert rendered.y_ticks == ticks


def test_tick_text_is_as_short_as_exact():
    # Efficiencies up to 0.95: the y axis reaches 1.14, ticks every 0.25.
    rendered = chart_readback.render(_plot.efficiency_chart(_batch_sweep_rows(), "mlp"))

    y_ticks = [text.text for text in rendered.texts if text.role == "y tick"]
    assert y_ticks == ["0", "0.25", "0.5", "0.75", "1"]


def test_batches_a_doubling_apart_are_evenly_spaced_on_the_logarithmic_axis():
    rows = [_row(2, batch, 0.9) for batch in (8, 16, 32, 128)]

    rendered = chart_readback.render(_plot.efficiency_chart(rows, "mlp"))

    centres = [(text.box[0] + text.box[2]) / 2 for text in rendered.texts if text.role == "x tick"]
    gaps = [right - left for left, right in zip(centres, centres[1:])]
    assert gaps[0] == pytest.approx(gaps[1], abs=1)
    assert gaps[2] == pytest.approx(2 * gaps[0], abs=1)


def test_no_text_of_the_efficiency_chart_is_clipped_or_overlaps_another():
    rendered = chart_readback.render(
        _plot.efficiency_chart(_batch_sweep_rows(), "mlp, weak scaling")
    )

    roles = {text.role for text in rendered.texts}
    assert roles == {"title", "x label", "y label", "x tick", "y tick", "legend"}
    for text in rendered.texts:
        left, top, right, bottom = text.box
        assert 0 <= left and right <= _plot.WIDTH_PX and 0 <= top and bottom <= _plot.HEIGHT_PX
    for index, text in enumerate(rendered.texts):
        for other in rendered.texts[index + 1 :]:
            overlap = (
                text.box[0] < other.box[2]
                and other.box[0] < text.box[2]
                and text.box[1] < other.box[3]
                and other.box[1] < text.box[3]
            )
            assert not overlap, (text, other)


def test_the_png_is_640_by_480_and_draws_each_line_in_its_colour():
    import matplotlib.colors
    import numpy as np

    rows = [_row(replicas, 32, 1.0) for replicas in (1, 2, 4)]

    pixels = _read_png(_plot.scaling_plot_png(rows, "mlp"))

    assert pixels.shape[:2] == (_plot.HEIGHT_PX, _plot.WIDTH_PX)
    colours = {tuple(rgb) for rgb in np.round(pixels[..., :3] * 255).astype(int).reshape(-1, 3)}
    for colour in (_plot.COLORS[0], _plot.GREY):  # the measured line, the ideal
        assert tuple(round(c * 255) for c in matplotlib.colors.to_rgb(colour)) in colours


def test_the_same_chart_gives_the_same_png_whatever_the_users_matplotlibrc():
    import matplotlib

    chart = _plot.scaling_chart([_row(1, 32, 1.0), _row(2, 32, 0.9)], "mlp")
    png = chart_readback.render(chart).png

    with matplotlib.rc_context(
        {"font.family": "serif", "axes.edgecolor": "red", "figure.facecolor": "black"}
    ):
        styled = chart_readback.render(chart).png

    assert styled == png


def test_without_matplotlib_render_raises_naming_the_extra(monkeypatch):
    for name in [name for name in sys.modules if name.split(".")[0] == "matplotlib"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails

    with pytest.raises(_plot.MatplotlibMissing, match=r"pip install 'keras-scaling\[plot\]'"):
        _plot.scaling_plot_png([_row(1, 32, 1.0)], "mlp")
