"""README.md's quick start runs as written, on this Keras and TensorFlow."""

import json
import os
import subprocess
import sys
import types

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TIMEOUT_S = 300
QUICK_START_HEADING = "## Quick start"


def python_block_after(heading):
    """The first ```python block after the Markdown heading `heading`."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as file:
        text = file.read()
    start = text.index(f"\n{heading}\n")
    block_start = text.index("```python\n", start) + len("```python\n")
    return text[block_start : text.index("```", block_start)]


def quick_start():
    """The README's quick start, as a user copies it."""
    return python_block_after(QUICK_START_HEADING)


@pytest.fixture(scope="module")
def quick_start_run(tmp_path_factory):
    """The quick start run once as a user runs it: its terminal output and its logs."""
    tmp_path = tmp_path_factory.mktemp("quick_start")
    result = subprocess.run(
        [sys.executable, "-c", quick_start()],
        cwd=tmp_path,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    with open(tmp_path / "logs" / "run" / "throughput.json") as file:
        record = json.load(file)
    return types.SimpleNamespace(
        result=result, record=record, logs=tmp_path / "logs", terminal=result.stdout + result.stderr
    )


def test_the_quick_start_trains_and_logs_on_two_replicas(quick_start_run):
    result, record = quick_start_run.result, quick_start_run.record
    assert record["num_replicas"] == 2 and record["global_batch_size"] == 128
    assert record["samples_per_sec"] > 0
    assert "diverged" not in result.stderr
    events = [
        name
        for _, _, names in os.walk(quick_start_run.logs)
        for name in names
        if name.startswith("events.out.tfevents")
    ]
    assert events


def test_the_quick_start_draws_at_least_ten_points_per_chart(quick_start_run):
    from keras_scaling.summaries import _tensorboard

    summaries = _tensorboard.read_summaries(quick_start_run.logs / "run" / "scaling")
    for tag in (
        "throughput/samples_per_sec",
        "throughput/per_replica_samples_per_sec",
        "throughput/steps_per_sec",
        "scaling/speedup",
        "scaling/efficiency",
        "throughput/gflops_per_sec",
    ):
        assert len(summaries[tag]) >= 10, (tag, [point.step for point in summaries[tag]])


def test_every_epoch_of_the_quick_start_has_its_samples_per_sec(quick_start_run):
    assert [epoch["epoch"] for epoch in quick_start_run.record["epochs"]] == [0, 1, 2]
    # The progress bar of each of the 3 epochs ends with it.
    assert quick_start_run.result.stdout.count("samples_per_sec: ") >= 3


def test_the_quick_starts_advice_shows_once_when_its_efficiency_is_low(quick_start_run):
    advice = quick_start_run.result.stderr.count("ThroughputLogger: scaling efficiency is")
    assert advice == (1 if quick_start_run.record["efficiency"] < 0.8 else 0)


def test_the_quick_start_prints_its_input_plan_once(quick_start_run):
    stdout = quick_start_run.result.stdout
    assert stdout.count("Input plan (MirroredStrategy, CPU):") == 1
    assert "batch:            64 per replica x 2 replicas = 128 global" in stdout


def test_the_quick_starts_terminal_has_no_deprecation_warning_and_no_internal_names(
    quick_start_run,
):
    terminal = quick_start_run.terminal
    assert "tensor_shape_from_node_def_name" not in terminal
    assert "is deprecated" not in terminal
    assert "keras_scaling.peak_flops" not in terminal and "PEAK_FLOPS" not in terminal


if __name__ == "__main__":
    # `make dist-check` runs the quick start against the installed wheel.
    print(quick_start())
