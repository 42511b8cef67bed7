"""Throughput arithmetic: measuring windows, steady state, speedup, read spacing.

Numbers in, numbers out, nothing about Keras. A point is `(time_s, iterations, samples)`:
a clock reading, the optimizer's step counter and the samples trained so far.
"""

import dataclasses
import math
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
        end_iterations: int, the optimizer's iterations at its end (its logged step).
        steps: int, optimizer steps taken in it.
        samples: int, samples trained in it (all replicas).
        duration_s: float, wall-clock seconds it lasted.

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
        """Samples per second, all replicas together."""
        return self.samples / self.duration_s

    @property
    def steps_per_sec(self) -> float:
        """Optimizer steps per second."""
        return self.steps / self.duration_s

    @property
    def step_time_s(self) -> float:
        """Mean seconds per optimizer step."""
        return self.duration_s / self.steps


class ThroughputWindow:
    """Turns consecutive points into measured intervals.

    `update` returns the `Interval` since the previous point, or None within
    the `warmup_steps` after `restart` or when no step was taken. Counters going
    backwards or steps in zero seconds raise `ValueError`; `update` before
    `restart`, `RuntimeError`.

    Example:

    ```python
    from keras_scaling.throughput import ThroughputWindow
    window = ThroughputWindow()
    window.restart(time_s=10.0, iterations=4, samples=128)
    window.update(time_s=10.5, iterations=14, samples=448).samples_per_sec   # 640.0
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
        """Opens the window at a point, `warmup_steps` after which are not measured."""
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self._last = (float(time_s), int(iterations), int(samples))
        self._measure_from_iterations = int(iterations) + warmup_steps if warmup_steps else None

    def close(self) -> None:
        """Closes the window: the next point must `restart` it."""
        self._last = None
        self._measure_from_iterations = None

    def update(self, *, time_s: float, iterations: int, samples: int) -> Interval | None:
        """Adds a point; returns the `Interval` since the previous one, or None."""
        if self._last is None:
            raise RuntimeError("ThroughputWindow.update called before restart")
        point = (float(time_s), int(iterations), int(samples))
        for name, value, last in zip(("time_s", "iterations", "samples"), point, self._last):
            if value < last:
                raise ValueError(
                    f"{name} went backwards within a window: {last} then {value}; restart the window when the counter is reset"
                )
        time_s, iterations, samples = point
        last_time_s, last_iterations, last_samples = self._last
        steps = iterations - last_iterations
        if steps == 0:
            return None
        if time_s == last_time_s:
            raise ValueError(
                f"{steps} step(s) took zero seconds (time_s={time_s}); the clock must advance while training"
            )
        self._last = point
        if self._measure_from_iterations is not None:
            if iterations >= self._measure_from_iterations:
                self._measure_from_iterations = None
            return None
        return Interval(iterations, steps, samples - last_samples, time_s - last_time_s)


def weighted_percentile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The smallest value whose cumulative weight reaches `q` percent (no interpolation).

    Args:
        values: sequence of floats.
        weights: sequence of positive numbers, one per value.
        q: float in [0, 100].

    Returns:
        One of `values`.

    Raises:
        ValueError: lengths differ, no value, `q` out of range or a weight <= 0.

    Example:

    ```python
    from keras_scaling.throughput import weighted_percentile
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
    threshold, cumulative = sum(weights) * q / 100.0, 0.0
    for value, weight in pairs:
        cumulative += weight
        if cumulative >= threshold:
            return value
    return pairs[-1][0]


@dataclasses.dataclass(frozen=True)
class SteadyState:
    """Steady-state throughput over measured intervals: the median step, not the mean.

    Args:
        samples_per_sec: float, samples per step / `step_time_p50_s`.
        steps_per_sec: float, 1 / `step_time_p50_s`.
        step_time_p10_s, step_time_p50_s, step_time_p90_s: float, step time percentiles, seconds.
        steps_measured, samples_measured, intervals_measured: int, what they are based on.

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
    """Collects measured intervals and gives their `SteadyState`.

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
        times = [interval.step_time_s for interval in self._intervals]
        steps = [interval.steps for interval in self._intervals]
        samples = sum(interval.samples for interval in self._intervals)
        p50 = weighted_percentile(times, steps, 50)
        return SteadyState(
            samples_per_sec=samples / sum(steps) / p50,
            steps_per_sec=1.0 / p50,
            step_time_p10_s=weighted_percentile(times, steps, 10),
            step_time_p50_s=p50,
            step_time_p90_s=weighted_percentile(times, steps, 90),
            steps_measured=sum(steps),
            samples_measured=samples,
            intervals_measured=len(self._intervals),
        )


@dataclasses.dataclass(frozen=True)
class Speedup:
    """Speedup over a baseline, against the ideal.

    Args:
        speedup: float, `samples_per_sec / baseline_samples_per_sec`.
        ideal_speedup: float, `num_replicas / baseline_num_replicas`.
        efficiency: float, `speedup / ideal_speedup`; 1.0 is perfect scaling.

    Example:

    ```python
    from keras_scaling.throughput import speedup
    speedup(1800.0, 1000.0, num_replicas=2).efficiency   # 0.9
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

    Args:
        samples_per_sec: float, the run's throughput, all replicas together.
        baseline_samples_per_sec: float, the baseline's, same per-replica batch.
        num_replicas: int, the run's replicas.
        baseline_num_replicas: int, the baseline's replicas, default 1.

    Returns:
        A `Speedup`.

    Raises:
        ValueError: a throughput not positive and finite, or fewer than 1 replica.

    Example:

    ```python
    from keras_scaling.throughput import speedup
    speedup(1800.0, 1000.0, num_replicas=2)   # Speedup(speedup=1.8, ideal_speedup=2.0, efficiency=0.9)
    ```
    """
    rate, unit = _validation.positive_number, "samples/sec"
    samples_per_sec = rate(samples_per_sec, "samples_per_sec", unit=unit)
    baseline_samples_per_sec = rate(baseline_samples_per_sec, "baseline_samples_per_sec", unit=unit)
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

    Rounded up to 1, 2 or 5 times a power of ten, at least `floor_steps`; with
    `run_steps`, at most `spacing_for_points(run_steps, steps_per_execution)`.

    Args:
        step_time_s: float, seconds per optimizer step.
        read_cost_s: float, seconds one read costs the training loop.
        max_share: float, the largest share of step time reads may take.
        floor_steps: int, the fewest steps between reads.
        run_steps: int or None, the optimizer steps the run will take.
        steps_per_execution: int, steps of one call of the train function.

    Returns:
        int, steps between reads.

    Raises:
        ValueError: a step time <= 0, a negative read cost or a floor < 1.

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
    needed = max(floor_steps, read_cost_s / (max_share * step_time_s))
    magnitude = 10 ** math.floor(math.log10(needed))
    steps = next(f * magnitude for f in (1, 2, 5, 10) if f * magnitude >= needed)
    steps = floor_steps if needed == floor_steps else int(steps)
    if run_steps is not None:
        steps = min(steps, spacing_for_points(run_steps, steps_per_execution))
    return steps


def spacing_for_points(run_steps: int, steps_per_execution: int = 1, points: int = 12) -> int:
    """The widest spacing of reads, in whole calls of the train function, giving `points` points.

    Args:
        run_steps: int, the optimizer steps the run will take.
        steps_per_execution: int, steps of one call of the train function.
        points: int, the points wanted; fewer than 12 do not read as a series.

    Returns:
        int, steps between reads, a multiple of `steps_per_execution`.

    Raises:
        ValueError: an argument < 1.

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
    return max(1, run_steps // points // steps_per_execution) * steps_per_execution


class ReadSchedule:
    """When to read the step counter next, counting calls of the train function in between.

    A read is due at the next multiple of `every_steps` (or the end of a warm-up),
    or at `epoch_end_iterations` when set and sooner; before `restart`, methods
    raise `RuntimeError`.

    Args:
        every_steps: int, steps between reads; may be changed at any time.
        steps_per_execution: int, steps of one call of the train function.

    Example:

    ```python
    from keras_scaling.throughput import ReadSchedule
    schedule = ReadSchedule(every_steps=10)
    schedule.restart(iterations=3)
    [schedule.count_execution() for _ in range(7)]   # [False, False, False, False, False, False, True]
    schedule.restart(iterations=10, warmup_steps=5)
    schedule.executions_until_due()   # 5
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
        """Counts from a read of the counter at `iterations`."""
        self._upper_bound, every = iterations, self.every_steps
        due = iterations + warmup_steps if warmup_steps else (iterations // every + 1) * every
        end = self.epoch_end_iterations
        self.next_read_iterations = end if end is not None and iterations < end < due else due

    def count_execution(self) -> bool:
        """Counts one call of the train function; True when a read is due."""
        due = self._due("count_execution")
        self._upper_bound += self.steps_per_execution
        return self._upper_bound >= due

    def executions_until_due(self) -> int:
        """Calls of the train function until a read is due, at least 1."""
        remaining = self._due("executions_until_due") - self._upper_bound
        return max(1, -(-remaining // self.steps_per_execution))

    def _due(self, method: str) -> int:
        if self.next_read_iterations is None:
            raise RuntimeError(
                f"ReadSchedule.{method} called before restart: restart it at a read of the step counter first"
            )
        return self.next_read_iterations
