"""The scaling table as Markdown: readable on a terminal and in TensorBoard."""

import math

_COLUMNS = (
    ("replicas", "{:d}", "replicas"),
    ("global batch", "{:d}", "global_batch_size"),
    ("samples/sec", "{:.1f}", "samples_per_sec"),
    ("speedup", "{:.2f}x", "speedup"),
    ("efficiency", "{:.2f}", "efficiency"),
    ("ideal", "{:g}x", "ideal_speedup"),
    ("model FLOP/s", "flops", "tflops_per_sec"),
    ("MFU", "{:.3f}", "mfu"),
    ("run", "{}", "run"),
)


def format_table(rows):
    """A Markdown table of `Row`s, numbers right-aligned, `-` for no figure.

    Example:

    ```
    | replicas | global batch | samples/sec | speedup | efficiency | ideal | model FLOP/s |   MFU | run        |
    |---------:|-------------:|------------:|--------:|-----------:|------:|-------------:|------:|:-----------|
    |        1 |           64 |      1000.0 |   1.00x |       1.00 |    1x |   3.20 GFLOP/s | 0.120 | replicas_1 |
    |        2 |          128 |      1900.0 |   1.90x |       0.95 |    2x |   6.08 GFLOP/s | 0.114 | replicas_2 |

    Efficiency and MFU are fractions (1.0 is perfect), as in TensorBoard and
    `throughput.json`; model FLOP/s are written with an SI prefix.
    ```
    """
    cells = [[title for title, _, _ in _COLUMNS]]
    for row in rows:
        cells.append([_cell(fmt, getattr(row, field)) for _, fmt, field in _COLUMNS])
    widths = [max(len(line[column]) for line in cells) for column in range(len(_COLUMNS))]
    lines = []
    for index, line in enumerate(cells):
        padded = [
            text.ljust(width) if field == "run" else text.rjust(width)
            for text, width, (_, _, field) in zip(line, widths, _COLUMNS)
        ]
        lines.append("| " + " | ".join(padded) + " |")
        if index == 0:
            rules = [
                ":" + "-" * (width - 1) if field == "run" else "-" * (width - 1) + ":"
                for width, (_, _, field) in zip(widths, _COLUMNS)
            ]
            lines.append("| " + " | ".join(rules) + " |")
    return "\n".join(lines)


def _cell(fmt, value):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if fmt == "flops":
        from keras_scaling.throughput._dashboard import flops_text_of

        return flops_text_of(value * 1e12, "/s")
    return fmt.format(value)
