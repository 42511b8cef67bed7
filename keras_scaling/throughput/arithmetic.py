"""Throughput arithmetic: measuring windows, steady-state statistics, speedup, read spacing.

Numbers in, numbers out: nothing here knows about Keras, so every figure
`ThroughputLogger` writes can be checked with made-up numbers and a fake clock.

A measurement point is `(time_s, iterations, samples)`: a clock reading in
seconds, the optimizer's step counter and the number of samples trained so far.
Throughput is measured between consecutive points of one window, and a window
is restarted wherever time that is not training must be left out (a new epoch
after validation and checkpoints, a retrace).
"""

import dataclasses
from collections.abc import Sequence

from keras_scaling import _validation

__all__ = [
    "Interval",
    "ReadSchedule",
    "Speedup",
    "SteadyState",
    "ThroughputStats",
    "ThroughputWindow",
    "auto_update_freq",
    "spacing_for_points",
    "speedup",
    "weighted_percentile",
]


@dataclasses.dataclass(frozen=True)
class Interval:
    """Training measured between two consecutive points of a window.

    Args:
        end_iterations: int, the optimizer's iterations at the end of the
            interval; the step at which its figures are logged.
        steps: int, optimizer steps taken in the interval.
        samples: int, samples trained in the interval (all replicas).
        duration_s: float, wall-clock seconds the interval lasted.

    Example:

    ```python
    from keras_scaling.throughput import Interval
    interval = Interval(end_iterations=20, steps=10, samples=320, duration_s=0.5)
    interval.samples_per_sec   # 640.0
    interval.step_time_s       # 0.05
    ```
    """

    end_iterations: int
    steps: int
    samples: int
    duration_s: float

    @property
    def samples_per_sec(self) -> float:
        """Samples per second over the interval, all replicas together."""
        return self.samples / self.duration_s

    @property
    def steps_per_sec(self) -> float:
        """Optimizer steps per second over the interval."""
        return self.steps / self.duration_s

    @property
    def step_time_s(self) -> float:
        """Mean seconds per optimizer step over the interval."""
        return self.duration_s / self.steps


class ThroughputWindow:
    """Turns consecutive measurement points into measured intervals.

    `restart` opens the window at a point; each `update` closes the interval
    since the previous point and returns it. Like Lightning's
    `_MonotonicWindow`, it raises instead of producing nonsense when time,
    iterations or samples go backwards within a window, or when steps were
    taken in no time at all.

    With `warmup_steps=N`, the first `N` steps after `restart` are not
    measured: the first point at or beyond them starts the measurement.

    Example:

    ```python
    from keras_scaling.throughput import ThroughputWindow
    window = ThroughputWindow()
    window.restart(time_s=10.0, iterations=4, samples=128)
    interval = window.update(time_s=10.5, iterations=14, samples=448)
    interval.samples_per_sec   # 640.0
    ```
    """

    def __init__(self) -> None:
        self._last: tuple[float, int, int] | None = None
        self._measure_from_iterations: int | None = None

    @property
    def is_open(self) -> bool:
        """Whether the window has a starting point."""
        return self._last is not None

    @property
    def is_measuring(self) -> bool:
        """Whether the window is open and its warm-up is over."""
        return self._last is not None and self._measure_from_iterations is None

    def restart(
        self, *, time_s: float, iterations: int, samples: int, warmup_steps: int = 0
    ) -> None:
        """Opens the window at a point; nothing before it is measured.

        Args:
            time_s: float, clock reading in seconds.
            iterations: int, the optimizer's iterations at that time.
            samples: int, samples trained so far.
            warmup_steps: int, steps after this point that are not measured.
        """
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self._last = (float(time_s), int(iterations), int(samples))
        self._measure_from_iterations = (
            int(iterations) + int(warmup_steps) if warmup_steps else None
        )

    def close(self) -> None:
        """Closes the window: the next point must `restart` it."""
        self._last = None
        self._measure_from_iterations = None

    def update(self, *, time_s: float, iterations: int, samples: int) -> Interval | None:
        """Adds a point and returns the `Interval` since the previous one.

        Returns None while warming up and when no step was taken since the
        previous point (then the previous point is kept).

        Raises:
            RuntimeError: the window is not open.
            ValueError: time, iterations or samples went backwards, or steps
                were taken in zero seconds.
        """
        if self._last is None:
            raise RuntimeError("ThroughputWindow.update called before restart")
        time_s, iterations, samples = float(time_s), int(iterations), int(samples)
        last_time_s, last_iterations, last_samples = self._last
        for name, value, last in (
            ("time_s", time_s, last_time_s),
            ("iterations", iterations, last_iterations),
            ("samples", samples, last_samples),
        ):
            if value < last:
                raise ValueError(
                    f"{name} went backwards within a window: {last} then "
                    f"{value}; restart the window when the counter is reset"
                )
        steps = iterations - last_iterations
        if steps == 0:
            return None
        if time_s == last_time_s:
            raise ValueError(
                f"{steps} step(s) took zero seconds (time_s={time_s}); the "
                "clock must advance while training"
            )
        self._last = (time_s, iterations, samples)
        if self._measure_from_iterations is not None:
            if iterations >= self._measure_from_iterations:
                self._measure_from_iterations = None
            return None
        return Interval(
            end_iterations=iterations,
            steps=steps,
            samples=samples - last_samples,
            duration_s=time_s - last_time_s,
        )


def weighted_percentile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The smallest value whose cumulative weight reaches `q` percent.

    With all weights 1 this is the "lower" percentile of the values: no
    interpolation, so the result is always one of the values.

    Args:
        values: sequence of floats.
        weights: sequence of positive numbers, one per value.
        q: float in [0, 100].

    Example:

    ```python
    from keras_scaling.throughput import weighted_percentile
    # step times of 3 intervals of 10, 10 and 80 steps
    weighted_percentile([0.5, 0.3, 0.2], [10, 10, 80], 50)   # 0.2
    ```
    """
    if len(values) != len(weights):
        raise ValueError(f"values and weights differ in length: {len(values)} and {len(weights)}")
    if not values:
        raise ValueError("weighted_percentile needs at least one value")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    if any(weight <= 0 for weight in weights):
        raise ValueError(f"weights must be positive, got {list(weights)}")
    pairs = sorted(zip(values, weights))
    total = sum(weights)
    threshold = total * q / 100.0
    cumulative = 0.0
    for value, weight in pairs:
        cumulative += weight
        if cumulative >= threshold:
            return value
    return pairs[-1][0]


@dataclasses.dataclass(frozen=True)
class SteadyState:
    """Steady-state throughput over all measured intervals.

    Percentiles are over steps: `step_time_p50_s` is the time of the median
    step. `samples_per_sec` is `samples per step / step_time_p50_s`, so a few
    slow intervals (a checkpoint saved mid-epoch, a garbage collection) do not
    move it.

    Args:
        samples_per_sec: float, median throughput, all replicas together.
        steps_per_sec: float, median optimizer steps per second.
        step_time_p10_s, step_time_p50_s, step_time_p90_s: float, step time
            percentiles in seconds.
        steps_measured: int, the steps the figures are based on.
        samples_measured: int, the samples the figures are based on.
        intervals_measured: int, the intervals the figures are based on.

    Example:

    ```python
    from keras_scaling.throughput import Interval, ThroughputStats
    stats = ThroughputStats()
    stats.add(Interval(end_iterations=10, steps=10, samples=320, duration_s=0.5))
    stats.add(Interval(end_iterations=20, steps=10, samples=320, duration_s=2.0))
    steady = stats.steady_state()
    steady.step_time_p50_s, steady.samples_per_sec   # (0.05, 640.0)
    ```
    """

    samples_per_sec: float
    steps_per_sec: float
    step_time_p10_s: float
    step_time_p50_s: float
    step_time_p90_s: float
    steps_measured: int
    samples_measured: int
    intervals_measured: int


class ThroughputStats:
    """Collects measured intervals and gives their steady state.

    Example:

    ```python
    from keras_scaling.throughput import Interval, ThroughputStats
    stats = ThroughputStats()
    stats.add(Interval(end_iterations=20, steps=10, samples=320, duration_s=0.5))
    stats.steady_state().samples_per_sec   # 640.0
    ```
    """

    def __init__(self) -> None:
        self._intervals: list[Interval] = []

    def add(self, interval: Interval) -> None:
        """Adds one `Interval`."""
        self._intervals.append(interval)

    def __len__(self) -> int:
        return len(self._intervals)

    def steady_state(self) -> SteadyState | None:
        """The `SteadyState` of the intervals so far, or None without any."""
        if not self._intervals:
            return None
        step_times = [interval.step_time_s for interval in self._intervals]
        steps = [interval.steps for interval in self._intervals]
        steps_measured = sum(steps)
        samples_measured = sum(interval.samples for interval in self._intervals)
        p50 = weighted_percentile(step_times, steps, 50)
        return SteadyState(
            samples_per_sec=samples_measured / steps_measured / p50,
            steps_per_sec=1.0 / p50,
            step_time_p10_s=weighted_percentile(step_times, steps, 10),
            step_time_p50_s=p50,
            step_time_p90_s=weighted_percentile(step_times, steps, 90),
            steps_measured=steps_measured,
            samples_measured=samples_measured,
            intervals_measured=len(self._intervals),
        )


@dataclasses.dataclass(frozen=True)
class Speedup:
    """Speedup over a baseline, against the ideal.

    Args:
        speedup: float, `samples_per_sec / baseline_samples_per_sec`.
        ideal_speedup: float, `num_replicas / baseline_num_replicas`: what
            perfect scaling would give.
        efficiency: float, `speedup / ideal_speedup`; 1.0 is perfect scaling.

    Example:

    ```python
    from keras_scaling.throughput import speedup
    result = speedup(1800.0, 1000.0, num_replicas=2)
    f"{result.speedup:.1f}x of {result.ideal_speedup:.0f}x, efficiency {result.efficiency:.2f}"
    # '1.8x of 2x, efficiency 0.90'
    ```
    """

    speedup: float
    ideal_speedup: float
    efficiency: float


def speedup(
    samples_per_sec: float,
    baseline_samples_per_sec: float,
    num_replicas: int,
    baseline_num_replicas: int = 1,
) -> Speedup:
    """Speedup, ideal speedup and scaling efficiency of a run over its baseline.

    The one place this arithmetic is done: `ThroughputLogger` (through it for
    each interval, and through `keras_scaling.baseline.speedup_of` for its
    record), `keras-scaling report` and `keras-scaling bench` all use it.

    Args:
        samples_per_sec: float, the run's throughput, all replicas together.
        baseline_samples_per_sec: float, the baseline's throughput with the
            same per-replica batch.
        num_replicas: int, the run's replicas.
        baseline_num_replicas: int, the baseline's replicas, default 1.

    Returns:
        A `Speedup`.

    Raises:
        ValueError: a throughput that is not positive and finite, or fewer
            than 1 replica.

    Example:

    ```python
    from keras_scaling.throughput import speedup
    # 2 replicas reach 1800 samples/s; one replica alone reached 1000.
    speedup(1800.0, 1000.0, num_replicas=2)
    # Speedup(speedup=1.8, ideal_speedup=2.0, efficiency=0.9)
    ```
    """
    samples_per_sec = _validation.positive_number(
        samples_per_sec, "samples_per_sec", unit="samples/sec"
    )
    baseline_samples_per_sec = _validation.positive_number(
        baseline_samples_per_sec, "baseline_samples_per_sec", unit="samples/sec"
    )
    num_replicas = _validation.positive_int(num_replicas, "num_replicas")
    baseline_num_replicas = _validation.positive_int(baseline_num_replicas, "baseline_num_replicas")
    ratio = samples_per_sec / baseline_samples_per_sec
    ideal_speedup = num_replicas / baseline_num_replicas
    return Speedup(speedup=ratio, ideal_speedup=ideal_speedup, efficiency=ratio / ideal_speedup)


def auto_update_freq(
    step_time_s: float,
    read_cost_s: float,
    *,
    max_share: float = 0.0025,
    floor_steps: int = 10,
    run_steps: int | None = None,
    steps_per_execution: int = 1,
) -> int:
    """Steps between counter reads so that reading costs at most `max_share` of training.

    Each read of the step counter waits for the devices and costs
    `read_cost_s`; spread over `n` steps of `step_time_s` it costs
    `read_cost_s / (n * step_time_s)`. The answer is rounded up to 1, 2 or 5
    times a power of ten, so the points fall on round steps. A run of known
    length is still drawn as a series: the spacing is at most
    `spacing_for_points(run_steps, steps_per_execution)` (a short run pays
    for its dozen reads; a long one is not affected).

    Args:
        step_time_s: float, seconds per optimizer step.
        read_cost_s: float, seconds one measurement costs the training loop.
        max_share: float, the largest share of step time measuring may take;
            default 0.0025 (0.25%).
        floor_steps: int, the fewest steps between reads (unless the run is
            too short for it).
        run_steps: int or None, the optimizer steps the run will take, when known.
        steps_per_execution: int, steps of one call of the train function.

    Returns:
        int, steps between reads.

    Example:

    ```python
    from keras_scaling.throughput import auto_update_freq
    auto_update_freq(0.0005, 0.0002)   # 200: 0.2 ms per read over 0.5 ms steps
    auto_update_freq(0.010, 0.0002)    # 10: long steps, the floor
    auto_update_freq(0.0005, 0.0002, run_steps=96, steps_per_execution=4)   # 8
    ```
    """
    step_time_s = _validation.positive_number(step_time_s, "step_time_s", unit="seconds")
    read_cost_s = _validation.non_negative_number(read_cost_s, "read_cost_s", unit="seconds")
    floor_steps = _validation.positive_int(floor_steps, "floor_steps")
    needed = read_cost_s / (max_share * step_time_s)
    steps = floor_steps
    magnitude = 1
    while steps < needed:
        for factor in (1, 2, 5):
            candidate = factor * magnitude
            if candidate >= floor_steps and candidate >= needed:
                steps = candidate
                break
        else:
            magnitude *= 10
            continue
        break
    if run_steps is not None:
        steps = min(steps, spacing_for_points(run_steps, steps_per_execution))
    return steps


# A chart of fewer points than this does not read as a series.
POINTS_PER_RUN = 12


def spacing_for_points(
    run_steps: int, steps_per_execution: int = 1, points: int = POINTS_PER_RUN
) -> int:
    """The widest spacing of reads that still gives a run of `run_steps` about `points` points.

    A multiple of `steps_per_execution` (reads happen between calls of the
    train function), at least one call.

    Args:
        run_steps: int, the optimizer steps the run will take.
        steps_per_execution: int, steps of one call of the train function.
        points: int, the points wanted; default 12 (warm-up and the first
            call of each epoch are not measured, so about 10 are drawn).

    Example:

    ```python
    from keras_scaling.throughput import spacing_for_points
    spacing_for_points(96, steps_per_execution=4)   # 8: 3 epochs of 32 steps
    spacing_for_points(100_000)                     # 8333
    ```
    """
    run_steps = _validation.positive_int(run_steps, "run_steps")
    steps_per_execution = _validation.positive_int(steps_per_execution, "steps_per_execution")
    points = _validation.positive_int(points, "points")
    calls = max(1, run_steps // points // steps_per_execution)
    return calls * steps_per_execution


class ReadSchedule:
    """When to read the step counter next, without reading it in between.

    Each read of the counter waits for the devices, so between reads the
    steps taken are only counted up from the calls of the train function,
    each at most `steps_per_execution` steps. A read is due once that count
    reaches the next multiple of `every_steps` (or the end of a warm-up), so
    points fall on regular steps.

    A read is also due at `epoch_end_iterations` when it is set and comes
    first, so that every epoch of known length ends on a point.

    Args:
        every_steps: int, steps between reads; may be changed at any time
            (it applies from the next `restart`).
        steps_per_execution: int, steps of one call of the train function.

    Example:

    ```python
    from keras_scaling.throughput import ReadSchedule
    schedule = ReadSchedule(every_steps=10)
    # The counter just read 3:
    schedule.restart(iterations=3)
    # Due at step 10, the 7th call:
    [schedule.count_execution() for _ in range(7)]   # [False, False, False, False, False, False, True]
    # Due at step 15:
    schedule.restart(iterations=10, warmup_steps=5)
    schedule.executions_until_due()   # 5: calls of one step each
    ```
    """

    def __init__(self, every_steps: int, steps_per_execution: int = 1) -> None:
        self.every_steps = _validation.positive_int(every_steps, "every_steps")
        self.steps_per_execution = _validation.positive_int(
            steps_per_execution, "steps_per_execution"
        )
        self.next_read_iterations: int | None = None
        self.epoch_end_iterations: int | None = None
        self._upper_bound = 0

    def restart(self, iterations: int, warmup_steps: int = 0) -> None:
        """Counts from a read of the counter: due after the warm-up, else at the next multiple.

        Or at the end of the epoch (`epoch_end_iterations`), when that comes first.
        """
        self._upper_bound = iterations
        if warmup_steps:
            self.next_read_iterations = iterations + warmup_steps
        else:
            self.next_read_iterations = (iterations // self.every_steps + 1) * self.every_steps
        if self.epoch_end_iterations is not None:
            if iterations < self.epoch_end_iterations < self.next_read_iterations:
                self.next_read_iterations = self.epoch_end_iterations

    def count_execution(self) -> bool:
        """Counts one call of the train function; True when a read is due."""
        next_read_iterations = self._next_read_iterations("count_execution")
        self._upper_bound += self.steps_per_execution
        return self._upper_bound >= next_read_iterations

    def executions_until_due(self) -> int:
        """Calls of the train function from here until a read is due: at least 1.

        The `count_execution` that returns True is the one this many calls on;
        a caller that only counts down need not call it for the calls before.
        """
        remaining = self._next_read_iterations("executions_until_due") - self._upper_bound
        return max(1, -(-remaining // self.steps_per_execution))

    def _next_read_iterations(self, method: str) -> int:
        if self.next_read_iterations is None:
            raise RuntimeError(
                f"ReadSchedule.{method} called before restart: restart it at a read of "
                "the step counter first"
            )
        return self.next_read_iterations
