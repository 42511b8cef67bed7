"""`keras-scaling report LOGDIR`: the scaling table of throughput.json files.

The runs here are hand-written `throughput.json` files, which are what
`report` reads: a user's own runs are exactly such files.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from keras_scaling.cli import _speedup_table
from keras_scaling.cli._speedup_table import format_table

# The tests that draw the chart in this process.
pytestmark = pytest.mark.usefixtures("matplotlib_importable")


def _write_run(
    directory,
    replicas,
    samples_per_sec,
    per_replica_batch_size=32,
    baseline_samples_per_sec=None,
    speedup=None,
    efficiency=None,
    flops_per_sample=None,
    mfu=None,
    baseline_num_replicas=None,
):
    os.makedirs(directory, exist_ok=True)
    record = {
        "version": 1,
        "samples_per_sec": samples_per_sec,
        "steps_per_sec": samples_per_sec and samples_per_sec / (per_replica_batch_size * replicas),
        "step_time_s": {"p10": 0.01, "p50": 0.011, "p90": 0.012},
        "num_replicas": replicas,
        "num_workers": 1,
        "per_replica_batch_size": per_replica_batch_size,
        "global_batch_size": per_replica_batch_size * replicas,
        "device_kind": "CPU",
        "dtype_policy": "float32",
        "strategy": "MirroredStrategy",
        "baseline_samples_per_sec": baseline_samples_per_sec,
        "baseline_source": "given" if baseline_samples_per_sec else None,
        "baseline_num_replicas": baseline_num_replicas,
        "speedup": speedup,
        "efficiency": efficiency,
        "steps_measured": 40,
        "startup_time_s": 1.5,
        "flops_per_sample": flops_per_sample,
        "flops_source": "counted" if flops_per_sample else None,
        "peak_flops_per_replica": None,
        "peak_source": None,
        "mfu": mfu,
    }
    with open(os.path.join(directory, "throughput.json"), "w") as file:
        json.dump(record, file)


def _report(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "keras_scaling", "report", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def _report_here(capsys, *args):
    """`keras-scaling report ARGS` in this process: (exit status, stdout, stderr)."""
    from keras_scaling.cli import main

    status = main(["report", *map(str, args)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def sweep(tmp_path):
    """Runs of 1, 2 and 4 replicas, as a bench leaves them (plus a nested run)."""
    _write_run(tmp_path / "replicas_1", 1, 1000.0)
    _write_run(tmp_path / "replicas_2", 2, 1800.0)
    _write_run(tmp_path / "more" / "replicas_4", 4, 3000.0)
    return tmp_path


def test_speedup_is_relative_to_the_one_replica_run(sweep):
    runs, problems = _speedup_table.find_runs(sweep)
    summary = _speedup_table.summarize(runs)

    assert problems == []
    assert [row.replicas for row in summary.rows] == [1, 2, 4]
    assert [row.speedup for row in summary.rows] == [1.0, 1.8, 3.0]
    assert [row.efficiency for row in summary.rows] == [1.0, 0.9, 0.75]
    assert [row.ideal_speedup for row in summary.rows] == [1, 2, 4]
    assert [row.global_batch_size for row in summary.rows] == [32, 64, 128]
    assert summary.baseline_samples_per_sec == 1000.0
    assert [row.run for row in summary.rows] == [
        "replicas_1",
        "replicas_2",
        os.path.join("more", "replicas_4"),
    ]


def test_without_a_one_replica_run_each_run_uses_its_recorded_baseline(tmp_path):
    _write_run(tmp_path / "a", 2, 1500.0, baseline_samples_per_sec=1000.0)
    _write_run(tmp_path / "b", 4, 2000.0, baseline_samples_per_sec=800.0)
    _write_run(tmp_path / "c", 8, 4000.0)
    _write_run(
        tmp_path / "d", 16, 6000.0, baseline_samples_per_sec=500.0, speedup=12.0, efficiency=0.75
    )

    summary = _speedup_table.summarize(_speedup_table.find_runs(tmp_path)[0])

    assert summary.baseline_samples_per_sec is None
    assert summary.rows[0].speedup == 1.5
    assert summary.rows[1].speedup == 2.5
    assert summary.rows[1].efficiency == 2.5 / 4
    assert math.isnan(summary.rows[2].speedup)
    assert (summary.rows[3].speedup, summary.rows[3].efficiency) == (12.0, 0.75)
    assert any("c has no baseline" in note for note in summary.notes)


def test_report_shows_the_ideal_and_efficiency_over_a_multi_replica_baseline(tmp_path):
    # 8 replicas over a 2-replica baseline: ideal 4, as ThroughputLogger writes it.
    _write_run(tmp_path / "a", 8, 3400.0, baseline_samples_per_sec=1000.0, baseline_num_replicas=2)

    (row,) = _speedup_table.summarize(_speedup_table.find_runs(tmp_path)[0]).rows

    assert (row.speedup, row.ideal_speedup) == (pytest.approx(3.4), 4.0)
    assert row.efficiency == pytest.approx(0.85)
    assert "|    4x |" in format_table([row])


def test_table_prints_every_column_and_a_dash_for_no_speedup(tmp_path):
    _write_run(tmp_path / "replicas_1", 1, 1000.0)
    _write_run(tmp_path / "replicas_2", 2, 1900.0)
    rows = list(_speedup_table.summarize(_speedup_table.find_runs(tmp_path)[0]).rows)
    rows.append(
        rows[1].__class__(
            **{**rows[1]._asdict(), "speedup": math.nan, "efficiency": math.nan, "run": "x"}
        )
    )

    lines = format_table(rows).splitlines()

    assert [cell.strip() for cell in lines[0].strip("|").split("|")] == [
        "replicas",
        "global batch",
        "samples/sec",
        "speedup",
        "efficiency",
        "ideal",
        "model FLOP/s",
        "MFU",
        "run",
    ]
    assert [cell.strip() for cell in lines[3].strip("|").split("|")] == [
        "2",
        "64",
        "1900.0",
        "1.90x",
        "0.95",
        "2x",
        "-",
        "-",
        "replicas_2",
    ]
    assert [cell.strip() for cell in lines[4].strip("|").split("|")][3:5] == ["-", "-"]


def test_report_shows_tflops_and_mfu_from_throughput_json(tmp_path, capsys):
    _write_run(tmp_path / "replicas_1", 1, 1000.0, flops_per_sample=4e9, mfu=0.125)
    _write_run(tmp_path / "replicas_2", 2, 1900.0, flops_per_sample=4e9)

    _, stdout, _ = _report_here(capsys, tmp_path, "--output", tmp_path / "plot.png")

    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert cells[0][6:8] == ["model FLOP/s", "MFU"]
    assert cells[2][6:8] == ["4.00 TFLOP/s", "0.125"]  # 4e9 FLOPs x 1000 samples/sec
    assert cells[3][6:8] == ["7.60 TFLOP/s", "-"]


def test_report_prints_the_table_and_writes_the_plot(sweep, env_with_matplotlib):
    result = _report(sweep, env=env_with_matplotlib)

    assert result.returncode == 0, result.stderr
    assert "|        4 |          128 |      3000.0 |   3.00x |       0.75 |    4x |" in (
        result.stdout
    )
    assert "1-replica run replicas_1 (1000.0 samples/sec)" in result.stdout
    with open(sweep / "scaling.png", "rb") as file:
        png = file.read()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    from PIL import Image

    with Image.open(sweep / "scaling.png") as image:
        assert image.size == (640, 480)


def test_report_without_matplotlib_prints_the_table_and_says_how_to_get_the_plot(
    sweep, env_without_matplotlib
):
    result = _report(sweep, env=env_without_matplotlib)

    assert result.returncode == 0, result.stderr
    assert "|        2 |           64 |      1800.0 |   1.80x |       0.90 |    2x |" in (
        result.stdout
    )
    assert result.stdout.count("pip install 'keras-scaling[plot]'") == 1
    assert f"No chart ({sweep / 'scaling.png'}): matplotlib cannot be imported" in result.stdout
    assert "Traceback" not in result.stderr
    assert not (sweep / "scaling.png").exists()


def test_report_skips_unreadable_files_and_says_which(sweep, capsys):
    os.makedirs(sweep / "broken")
    (sweep / "broken" / "throughput.json").write_text("{not json")

    status, stdout, stderr = _report_here(capsys, sweep, "--output", sweep / "plot.png")

    assert status == 0, stderr
    assert "skipped" in stderr and "broken" in stderr
    assert "replicas_2" in stdout
    assert (sweep / "plot.png").stat().st_size > 1000


def test_a_run_too_short_to_measure_is_skipped_with_the_reason(sweep):
    _write_run(sweep / "short", 2, None)

    runs, problems = _speedup_table.find_runs(sweep)

    assert [run.name for run in runs] == [
        os.path.join("more", "replicas_4"),
        "replicas_1",
        "replicas_2",
    ]
    assert len(problems) == 1 and "holds no measured samples_per_sec" in problems[0]


def test_report_on_a_directory_without_runs_exits_2(tmp_path):
    result = _report(tmp_path)

    assert result.returncode == 2
    assert "no readable throughput.json" in result.stderr
    assert "Traceback" not in result.stderr


def test_report_on_a_missing_directory_exits_2(tmp_path, capsys):
    status, _, stderr = _report_here(capsys, tmp_path / "nowhere")

    assert status == 2
    assert "is not a directory" in stderr


def test_report_plots_the_ideal_of_a_multi_replica_baseline():
    from keras_scaling.cli import _plot

    def row(replicas, ideal_speedup):
        return _speedup_table.Row(
            run=f"replicas_{replicas}",
            replicas=replicas,
            per_replica_batch_size=32,
            global_batch_size=32 * replicas,
            samples_per_sec=100.0 * replicas,
            speedup=0.9 * ideal_speedup,
            efficiency=0.9,
            ideal_speedup=ideal_speedup,
        )

    over_two = _plot.scaling_chart([row(4, 2.0), row(8, 4.0)], "over a 2-replica baseline")
    over_one = _plot.scaling_chart([row(1, 1.0), row(4, 4.0)], "over 1 replica")

    ideal_two = next(line for line in over_two.lines if line.label.startswith("ideal"))
    ideal_one = next(line for line in over_one.lines if line.label.startswith("ideal"))
    assert ideal_two.points == ((4, 2.0), (8, 4.0))
    assert ideal_two.label == "ideal (replicas / baseline's)"
    assert over_two.y_label == "speedup over the baseline (×)"
    assert ideal_one.points == ((1, 1.0), (4, 4.0))
    assert ideal_one.label == "ideal (= replicas)"
    assert over_one.y_label == "speedup over 1 replica (×)"
