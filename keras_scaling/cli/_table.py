"""The scaling table as Markdown: readable on a terminal and in TensorBoard."""

import math

_COLUMNS = (
    ("replicas", "{:d}", "replicas"),
    ("global batch", "{:d}", "global_batch_size"),
    ("samples/sec", "{:.1f}", "samples_per_sec"),
    ("speedup", "{:.2f}x", "speedup"),
    ("efficiency", "{:.0%}", "efficiency"),
    ("ideal", "{:g}x", "ideal_speedup"),
    ("TFLOP/s", "{:.3g}", "tflops_per_sec"),
    ("MFU", "{:.1%}", "mfu"),
    ("run", "{}", "run"),
)


def format_table(rows):
    """A Markdown table of `Row`s, numbers right-aligned, `-` for no figure.

    Example:

    ```
    | replicas | global batch | samples/sec | speedup | efficiency | ideal | TFLOP/s |   MFU | run        |
    |---------:|-------------:|------------:|--------:|-----------:|------:|--------:|------:|:-----------|
    |        1 |           64 |      1000.0 |   1.00x |       100% |    1x |  0.0032 | 12.0% | replicas_1 |
    |        2 |          128 |      1900.0 |   1.90x |        95% |    2x |  0.0061 | 11.4% | replicas_2 |
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
    return fmt.format(value)
