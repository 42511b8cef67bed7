"""The measuring core, with made-up numbers and a fake clock."""

import pytest

from keras_scaling.throughput.arithmetic import (
    Interval,
    ReadSchedule,
    ThroughputStats,
    ThroughputWindow,
    auto_update_freq,
    spacing_for_points,
    speedup,
    weighted_percentile,
)


class FakeClock:
    def __init__(self, start_s=100.0):
        self.now_s = start_s

    def advance(self, seconds):
        self.now_s += seconds
        return self.now_s


@pytest.mark.parametrize("steps_per_execution", [1, 3, 7])
@pytest.mark.parametrize("every_steps", [1, 10, 25])
@pytest.mark.parametrize(("iterations", "warmup_steps"), [(0, 0), (4, 0), (10, 0), (3, 5), (3, 1)])
def test_executions_until_due_is_the_call_at_which_count_execution_is_due(
    steps_per_execution, every_steps, iterations, warmup_steps
):
    schedule = ReadSchedule(every_steps, steps_per_execution=steps_per_execution)
    schedule.restart(iterations, warmup_steps)
    countdown = schedule.executions_until_due()
    calls = 1
    while not schedule.count_execution():
        calls += 1
    assert countdown == calls
    # Once due, the next read is due at once.
    assert schedule.executions_until_due() == 1


def test_interval_figures_come_from_steps_samples_and_time():
    interval = Interval(end_iterations=30, steps=10, samples=320, duration_s=0.5)
    assert interval.samples_per_sec == 640.0
    assert interval.steps_per_sec == 20.0
    assert interval.step_time_s == 0.05


def test_window_measures_between_consecutive_points():
    clock = FakeClock()
    window = ThroughputWindow()
    window.restart(time_s=clock.now_s, iterations=4, samples=4 * 32)
    first = window.update(time_s=clock.advance(0.5), iterations=14, samples=14 * 32)
    second = window.update(time_s=clock.advance(0.25), iterations=24, samples=24 * 32)
    assert (first.end_iterations, first.steps, first.samples) == (14, 10, 320)
    assert first.samples_per_sec == pytest.approx(640.0)
    assert (second.end_iterations, second.steps) == (24, 10)
    assert second.samples_per_sec == pytest.approx(1280.0)


def test_window_does_not_measure_warmup_steps():
    clock = FakeClock()
    window = ThroughputWindow()
    window.restart(time_s=clock.now_s, iterations=1, samples=32, warmup_steps=5)
    assert window.is_open and not window.is_measuring
    # 3 steps in: still warming up; 6 steps in: warm-up over, not measured.
    assert window.update(time_s=clock.advance(3.0), iterations=4, samples=128) is None
    assert window.update(time_s=clock.advance(3.0), iterations=7, samples=224) is None
    assert window.is_measuring
    interval = window.update(time_s=clock.advance(1.0), iterations=17, samples=544)
    assert interval.steps == 10 and interval.duration_s == pytest.approx(1.0)


def test_window_restart_leaves_out_time_between_windows():
    clock = FakeClock()
    window = ThroughputWindow()
    window.restart(time_s=clock.now_s, iterations=0, samples=0)
    window.update(time_s=clock.advance(1.0), iterations=10, samples=100)
    clock.advance(60.0)  # validation, checkpoints
    window.restart(time_s=clock.now_s, iterations=11, samples=110)
    interval = window.update(time_s=clock.advance(1.0), iterations=21, samples=210)
    assert interval.duration_s == pytest.approx(1.0)
    assert interval.samples_per_sec == pytest.approx(100.0)


def test_window_without_new_steps_keeps_its_previous_point():
    clock = FakeClock()
    window = ThroughputWindow()
    window.restart(time_s=clock.now_s, iterations=10, samples=100)
    assert window.update(time_s=clock.advance(1.0), iterations=10, samples=100) is None
    interval = window.update(time_s=clock.advance(1.0), iterations=20, samples=200)
    assert interval.duration_s == pytest.approx(2.0)


@pytest.mark.parametrize(
    "point, name",
    [
        ({"time_s": 99.0, "iterations": 20, "samples": 200}, "time_s"),
        ({"time_s": 101.0, "iterations": 5, "samples": 200}, "iterations"),
        ({"time_s": 101.0, "iterations": 20, "samples": 50}, "samples"),
    ],
)
def test_window_refuses_counters_going_backwards(point, name):
    window = ThroughputWindow()
    window.restart(time_s=100.0, iterations=10, samples=100)
    with pytest.raises(ValueError, match=f"{name} went backwards"):
        window.update(**point)


def test_window_refuses_steps_in_zero_seconds():
    window = ThroughputWindow()
    window.restart(time_s=100.0, iterations=10, samples=100)
    with pytest.raises(ValueError, match="took zero seconds"):
        window.update(time_s=100.0, iterations=11, samples=110)


def test_window_must_be_restarted_after_close():
    window = ThroughputWindow()
    window.restart(time_s=0.0, iterations=0, samples=0)
    window.close()
    with pytest.raises(RuntimeError, match="before restart"):
        window.update(time_s=1.0, iterations=1, samples=1)


def test_weighted_percentile_weighs_by_steps():
    # 80 of 100 steps took 0.2 s: the median step took 0.2 s.
    assert weighted_percentile([0.5, 0.3, 0.2], [10, 10, 80], 50) == 0.2
    assert weighted_percentile([0.5, 0.3, 0.2], [10, 10, 80], 90) == 0.3
    assert weighted_percentile([0.5, 0.3, 0.2], [10, 10, 80], 100) == 0.5
    assert weighted_percentile([3.0, 1.0, 2.0], [1, 1, 1], 50) == 2.0


@pytest.mark.parametrize(
    "values, weights, q, message",
    [
        ([], [], 50, "at least one value"),
        ([1.0], [1, 2], 50, "differ in length"),
        ([1.0], [1], 101, "q must be in"),
        ([1.0], [0], 50, "weights must be positive"),
    ],
)
def test_weighted_percentile_refuses_bad_input(values, weights, q, message):
    with pytest.raises(ValueError, match=message):
        weighted_percentile(values, weights, q)


def test_steady_state_is_the_median_step_not_slow_outliers():
    stats = ThroughputStats()
    assert stats.steady_state() is None
    for _ in range(8):
        stats.add(Interval(end_iterations=0, steps=10, samples=640, duration_s=0.1))
    # A checkpoint saved mid-epoch: one interval 20 times slower.
    stats.add(Interval(end_iterations=0, steps=10, samples=640, duration_s=2.0))
    steady = stats.steady_state()
    assert steady.step_time_p50_s == pytest.approx(0.01)
    assert steady.samples_per_sec == pytest.approx(6400.0)
    assert steady.steps_per_sec == pytest.approx(100.0)
    # The slow interval holds the slowest 11% of steps: p90 shows it.
    assert steady.step_time_p90_s == pytest.approx(0.2)
    assert steady.step_time_p10_s == pytest.approx(0.01)
    assert (steady.steps_measured, steady.samples_measured) == (90, 5760)
    assert steady.intervals_measured == 9


def test_steady_state_percentiles_spread_with_step_times():
    stats = ThroughputStats()
    for step_time_s in (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.10):
        stats.add(Interval(0, steps=5, samples=5 * 16, duration_s=5 * step_time_s))
    steady = stats.steady_state()
    assert steady.step_time_p10_s == pytest.approx(0.01)
    assert steady.step_time_p50_s == pytest.approx(0.05)
    assert steady.step_time_p90_s == pytest.approx(0.09)
    assert steady.samples_per_sec == pytest.approx(16 / 0.05)


def test_speedup_divides_by_baseline_and_by_ideal():
    figures = speedup(1800.0, 1000.0, num_replicas=2)
    assert figures.speedup == pytest.approx(1.8)
    assert figures.ideal_speedup == 2.0
    assert figures.efficiency == pytest.approx(0.9)


def test_speedup_over_a_multi_replica_baseline_compares_replica_ratios():
    figures = speedup(3400.0, 1000.0, num_replicas=8, baseline_num_replicas=2)
    assert figures.speedup == pytest.approx(3.4)
    assert figures.ideal_speedup == 4.0
    assert figures.efficiency == pytest.approx(0.85)


@pytest.mark.parametrize(
    "args, message",
    [
        ((0.0, 1000.0, 2), "samples_per_sec must be a positive"),
        ((100.0, -1.0, 2), "baseline_samples_per_sec must be a positive"),
        ((100.0, float("nan"), 2), "baseline_samples_per_sec must be a positive"),
        ((100.0, 100.0, 0), "num_replicas must be a positive integer"),
    ],
)
def test_speedup_refuses_nonsense(args, message):
    with pytest.raises(ValueError, match=message):
        speedup(*args)


@pytest.mark.parametrize(
    "step_time_s, read_cost_s, expected",
    [
        (0.010, 0.0002, 10),  # long steps: the floor
        (0.0005, 0.0002, 200),  # 0.2 ms reads over 0.5 ms steps need 160 steps: 200
        (0.001, 0.0002, 100),  # 80 steps needed: 100
        (0.001, 0.00026, 200),  # 104 steps needed: 200
        (0.0001, 0.0002, 1000),  # 800 steps needed: 1000
        (0.001, 0.0, 10),
    ],
)
def test_auto_update_freq_keeps_reads_under_a_quarter_percent_on_round_steps(
    step_time_s, read_cost_s, expected
):
    steps = auto_update_freq(step_time_s, read_cost_s)
    assert steps == expected
    assert read_cost_s / (steps * step_time_s) <= 0.0025


def test_auto_update_freq_keeps_a_short_run_a_series_of_points():
    # Reads ask for 200 steps between them; a run of 96 steps gets one every 8.
    assert auto_update_freq(0.0005, 0.0002, run_steps=96, steps_per_execution=4) == 8
    # A run long enough for a dozen points at the cheap spacing keeps it.
    assert auto_update_freq(0.0005, 0.0002, run_steps=100_000) == 200


@pytest.mark.parametrize(
    ("run_steps", "steps_per_execution", "expected"),
    [(96, 4, 8), (30, 1, 2), (12, 1, 1), (5, 4, 4), (100, 3, 6), (12_000, 1, 1000)],
)
def test_spacing_for_points_is_whole_calls_giving_about_a_dozen_points(
    run_steps, steps_per_execution, expected
):
    spacing = spacing_for_points(run_steps, steps_per_execution)
    assert spacing == expected
    assert spacing % steps_per_execution == 0


def test_spacing_for_points_refuses_a_run_of_no_steps():
    with pytest.raises(ValueError, match="run_steps must be a positive integer"):
        spacing_for_points(0)


def test_a_read_is_due_at_the_end_of_the_epoch_when_it_comes_first():
    schedule = ReadSchedule(every_steps=20, steps_per_execution=2)
    schedule.epoch_end_iterations = 30
    schedule.restart(iterations=22)
    assert schedule.next_read_iterations == 30
    assert schedule.executions_until_due() == 4
    # Past the end of the epoch, the multiples again.
    schedule.restart(iterations=30)
    assert schedule.next_read_iterations == 40


@pytest.mark.parametrize("method", ["count_execution", "executions_until_due"])
def test_a_read_schedule_used_before_restart_says_to_restart_it(method):
    # Without a read of the counter there is nothing to count from: the
    # schedule says so instead of comparing with None.
    schedule = ReadSchedule(every_steps=10)

    with pytest.raises(RuntimeError, match=f"ReadSchedule.{method} called before restart"):
        getattr(schedule, method)()


def test_auto_update_freq_refuses_a_step_of_no_time():
    with pytest.raises(ValueError, match="step_time_s must be a positive number"):
        auto_update_freq(0.0, 0.001)


def _examples(module_name):
    """The ```python blocks of every docstring of a module, with where they are."""
    import ast
    import importlib.util
    import re

    source = importlib.util.find_spec(module_name).origin
    with open(source, encoding="utf-8") as file:
        tree = ast.parse(file.read())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
            for block in re.findall(r"```python\n(.*?)```", ast.get_docstring(node) or "", re.S):
                yield pytest.param(block, id=f"{module_name}.{getattr(node, 'name', '')}")


# The modules whose examples need no TensorFlow; test_docstring_examples.py
# runs the public examples of the others (ThroughputLogger's, baseline's).
_EXAMPLE_MODULES = (
    "keras_scaling.throughput.arithmetic",
    "keras_scaling.throughput._run_record",
)


@pytest.mark.parametrize(
    "code", [example for module in _EXAMPLE_MODULES for example in _examples(module)]
)
def test_docstring_example_runs_as_written_in_a_fresh_process(code, tmp_path):
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, result.stderr[-3000:]


# --- the logger's pure helpers: dashboard text, advice, background saving -------


def test_a_baseline_inside_the_log_dir_is_named_relative_to_it(tmp_path):
    from keras_scaling.throughput import _dashboard as dashboard

    inside = tmp_path / "runs" / "one" / "throughput.json"
    assert dashboard.path_for_display(inside, tmp_path / "runs") == "one/throughput.json"
    outside = tmp_path / "elsewhere" / "throughput.json"
    assert dashboard.path_for_display(outside, tmp_path / "runs") == str(outside)


def test_setup_table_has_a_header_and_no_empty_rows():
    from keras_scaling.throughput import _dashboard as dashboard

    text = dashboard.setup_markdown([("replicas", 2), ("note", None), ("empty", "")])
    assert text.splitlines() == ["| setting | value |", "|---|---|", "| replicas | 2 |"]


def test_short_step_advice_only_below_five_ms_and_one_step_per_call():
    from keras_scaling.throughput import _advice as advice

    assert "steps_per_execution=20" in advice.short_steps(0.001, 1)
    assert advice.short_steps(0.001, 4) is None
    assert advice.short_steps(0.006, 1) is None


def test_low_efficiency_advice_gives_the_input_rate_and_points_to_explain():
    from keras_scaling.throughput import _advice as advice

    low = speedup(1000.0, 1000.0, num_replicas=2)  # efficiency 0.5
    slow_input = advice.low_efficiency(low, 1000.0, 1100.0, None, host_cpu_replicas=False)
    assert "barely more than training takes (1000)" in slow_input
    assert "keras_scaling.explain(model, data)" in slow_input
    fast_input = advice.low_efficiency(low, 1000.0, 5000.0, None, host_cpu_replicas=True)
    assert "well above the 1000" in fast_input and "share its cores" in fast_input
    assert "keras-scaling bench --explain" in fast_input
    untimed = advice.low_efficiency(low, 1000.0, None, "it runs Python", host_cpu_replicas=False)
    assert "could not be timed alone (it runs Python)" in untimed
    assert "keras_scaling.explain" in untimed
    assert (
        advice.low_efficiency(
            speedup(1900.0, 1000.0, 2), 1900.0, None, "x", host_cpu_replicas=False
        )
        is None
    )


def test_flops_are_written_out_with_an_si_prefix_or_in_full():
    from keras_scaling.throughput._dashboard import flops_text_of

    assert flops_text_of(4616.97) == "4,617 FLOPs"
    assert flops_text_of(3.21e6) == "3.21 MFLOPs"
    assert flops_text_of(2e11, "/s") == "200 GFLOP/s"
    assert flops_text_of(60.9e9, "/s") == "60.9 GFLOP/s"


def test_model_flops_per_sec_are_gflops_on_cpus_and_tflops_elsewhere():
    from keras_scaling.mfu._throughput_flops import ModelFlops

    for device_kind, tag, value in (
        ("CPU", "throughput/gflops_per_sec", 4.0),
        ("GPU", "throughput/tflops_per_sec", 0.004),
    ):
        model_flops = ModelFlops(flops_per_sample=4e6, num_replicas=2, device_kind=device_kind)
        scalars = model_flops.scalars(1000.0)  # 4e9 FLOP/s
        assert scalars[tag] == pytest.approx(value)
        per_replica = tag.replace("throughput/", "throughput/per_replica_")
        assert scalars[per_replica] == pytest.approx(value / 2)
        assert model_flops.flops_tag == tag and not model_flops.has_mfu


def test_a_bench_run_names_the_peak_option_of_the_command_line():
    from keras_scaling.mfu import _throughput_flops, peak_flops

    _, reason = peak_flops.resolve(
        "auto", device_kind="CPU", device="/device:CPU:0", compute_dtype="float32"
    )
    text = _throughput_flops._as_command_line(reason)
    assert "--peak-flops <FLOP/s of one replica> or --peak-flops measure" in text
    assert "peak_flops=" not in text
