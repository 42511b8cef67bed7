"""The bench's charts, drawn with Pillow: round ticks, a logarithmic axis, the efficiency chart."""

import io

import pytest

from keras_scaling.cli import _chart, _plot, _speedup_table


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


@pytest.mark.parametrize(
    "low, high, ticks",
    [
        (0, 9.6, (0, 2, 4, 6, 8)),
        (0, 1.2, (0, 0.25, 0.5, 0.75, 1.0)),
        (0, 1.0, (0, 0.2, 0.4, 0.6, 0.8, 1.0)),
        (0, 1.17, (0, 0.25, 0.5, 0.75, 1.0)),
        (0, 4.56, (0, 1, 2, 3, 4)),
        (0, 120, (0, 25, 50, 75, 100)),
        (1, 3, (1, 1.5, 2, 2.5, 3)),
        (2, 2, (2,)),
    ],
)
def test_y_ticks_fall_on_round_numbers(low, high, ticks):
    assert _chart.round_ticks(low, high) == ticks


def test_tick_text_is_as_short_as_exact():
    assert [_chart.tick_text(value) for value in (0, 2.0, 0.25, 1.5, 100.0)] == [
        "0",
        "2",
        "0.25",
        "1.5",
        "100",
    ]


def test_the_efficiency_chart_has_a_line_per_replica_count_and_the_threshold_across():
    rows = [
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

    chart = _plot.efficiency_chart(rows, "mlp", threshold=0.9)

    assert [(line.label, line.points) for line in chart.lines] == [
        ("2 replicas", ((8, 0.6), (32, 0.95))),
        ("4 replicas", ((8, 0.4), (32, 0.8))),
        ("0.90", ((chart.x_range[0], 0.9), (chart.x_range[1], 0.9))),
    ]
    assert chart.x_log2 and chart.x_ticks == ((8, "8"), (32, "32"))
    assert chart.x_range[0] < 8 and 32 < chart.x_range[1]
    assert chart.y_range == (0, pytest.approx(0.95 * 1.2))


def test_batches_a_doubling_apart_are_evenly_spaced_on_the_logarithmic_axis():
    rows = [_row(2, batch, 0.9) for batch in (8, 16, 32, 128)]

    rendered = _chart.render(_plot.efficiency_chart(rows, "mlp"))

    centres = [(text.box[0] + text.box[2]) / 2 for text in rendered.texts if text.role == "x tick"]
    gaps = [right - left for left, right in zip(centres, centres[1:])]
    assert gaps[0] == pytest.approx(gaps[1], abs=1)
    assert gaps[2] == pytest.approx(2 * gaps[0], abs=1)


def test_the_png_is_640_by_480_and_draws_each_line_in_its_colour():
    from PIL import Image

    rows = [_row(replicas, 32, 1.0) for replicas in (1, 2, 4)]

    png = _plot.scaling_plot_png(rows, "mlp")

    with Image.open(io.BytesIO(png)) as image:
        assert image.size == (_chart.WIDTH_PX, _chart.HEIGHT_PX)
        colours = {colour for _, colour in image.convert("RGB").getcolors(1 << 20)}
    assert _chart.COLORS[0] in colours  # the measured line
    assert _chart.GREY in colours  # the ideal
