"""`ThroughputLogger`: throughput, speedup and scaling efficiency in TensorBoard."""

import dataclasses
import logging
import math
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import keras

from keras_scaling import _validation, devices
from keras_scaling.data import _iterator_plan
from keras_scaling.fit_hooks import _fit_end, _step_counter, _trace_count, _train_function_hook
from keras_scaling.mfu import _throughput_flops
from keras_scaling.mfu import utilization as utilization_lib
from keras_scaling.summaries import _tensorboard
from keras_scaling.throughput import _advice as advice_lib
from keras_scaling.throughput import _dashboard as dashboard
from keras_scaling.throughput import _input_timing, _run_record
from keras_scaling.throughput import baseline as baseline_lib
from keras_scaling.throughput._writer import ThroughputWriter
from keras_scaling.throughput.arithmetic import (
    ReadSchedule,
    SteadyState,
    ThroughputStats,
    ThroughputWindow,
    auto_update_freq,
    spacing_for_points,
)

__all__ = ["ThroughputLogger"]

# By model and log_dir: the optimizer whose counter gave the steps of its last
# fit in this process, the offset added to them, and the last step written.
_steps_written: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _step_offset(model, log_dir):
    """What a fit adds to the step counter: after a `compile` gave the model a new optimizer
    in this process, whose counter starts again, the last step its earlier fits wrote, so
    that the fine-tuning `fit` of transfer learning continues the chart instead of being
    left out as steps already written; otherwise what the counter's earlier fits added."""
    earlier = _steps_written.get(model, {}).get(log_dir)
    if earlier is None:
        return 0
    optimizer, offset, last_step = earlier
    return offset if optimizer() is model.optimizer else last_step


def _remember_steps(model, log_dir, offset, last_step):
    _steps_written.setdefault(model, {})[log_dir] = (
        weakref.ref(model.optimizer),
        offset,
        last_step,
    )


logger = logging.getLogger("keras_scaling")

DEFAULT_WARMUP_STEPS = 5
# update_freq="auto": reads at least 10 steps apart and, once a step is
# timed, costing at most 0.1% of training (a read taken as 1 ms: the wait
# for the devices plus their idling while the next step is dispatched).
_AUTO_FLOOR_STEPS = 10
_AUTO_READ_COST_S = 0.001
_AUTO_MAX_SHARE = 0.001
_ADVICE_AFTER_INTERVALS = 3
# Set before TensorFlow starts, each logical CPU has a thread pool of its own
# (tensorflow/core/common_runtime/local_device.cc), as `keras-scaling bench` does.
_THREADPOOL_ENV = "TF_OVERRIDE_GLOBAL_THREADPOOL"


class _CounterUnknown(Exception):
    """The batches trained cannot be read in this fit (the probe has said why)."""


@dataclasses.dataclass
class _Fit:
    """What one `fit` call holds: made at `on_train_begin`, dropped with the fit."""

    info: Any
    begin_s: float
    steps_per_epoch: int | None
    run_steps: int | None
    changes: Any
    hook: Any = None
    counter: Any = None
    element_spec: Any = None
    iterator: Callable[[], Any] = lambda: None  # weak: each epoch's is freed when Keras drops it
    started: bool = False  # its first execution has ended
    finished: bool = False
    executions_until_due: int = 1  # calls of the train function until the next read
    traces_at_read: int = 0
    epoch_points: list = dataclasses.field(default_factory=list)  # the epoch's first and last
    epoch_stats: ThroughputStats = dataclasses.field(default_factory=ThroughputStats)


class ThroughputLogger(keras.callbacks.Callback):
    """Writes throughput, speedup and scaling efficiency to TensorBoard.

    Scalars go to the run `log_dir/scaling`, beside the loss that
    `keras.callbacks.TensorBoard(log_dir)` writes, at the optimizer's
    `iterations`; every tag is in the TensorBoard reference page. It also
    writes Custom Scalars charts, the set-up and its advice as text, and
    `log_dir/throughput.json` (written before `fit` returns, and kept up to
    date while it trains), and adds `samples_per_sec` to each epoch's logs
    (NaN for an epoch in which nothing could be timed): put `History`,
    `CSVLogger` and Keras' `TensorBoard` after it.

    Samples are the optimizer's step counter times the global batch, so
    `steps_per_execution`, gradient accumulation and resumed runs count
    right. The first execution of each `fit` plus `warmup_steps`, retraced
    intervals and the time between epochs are left out. The baseline and
    the FLOPs count are set up before the first step of the first `fit`,
    never between steps. Under `MultiWorkerMirroredStrategy` only the chief
    writes. The throughput guide explains how it measures.

    Args:
        log_dir: str or path, the run's log directory, as given to
            `keras.callbacks.TensorBoard`.
        baseline: the samples/sec of one replica with the same per-replica
            batch: a number, a path to an earlier run's `log_dir` or
            `throughput.json`, `"measure"` (times a copy of the model alone
            on one device), `"auto"` (the run itself with one replica,
            `"measure"` with several) or None (no `scaling/` tags); default
            `"auto"`.
        update_freq: `"auto"` (the default: about a dozen points a `fit` at
            least, reads costing at most about 0.1%, a point at the end of
            every epoch) or an int, optimizer steps between points.
        warmup_steps: int, steps after the first execution of each `fit`
            that are not measured; default None means 5.
        global_batch_size: int, samples per optimizer step over all
            replicas; default None reads it from the data, and when it
            cannot, measures nothing and says to pass it.
        flops_per_sample: `"auto"` (counted), a positive number or None.
        peak_flops: `"auto"` (looked up), `"measure"`, a positive number
            (FLOP/s of one replica) or None.
        clock: callable returning seconds, default `time.perf_counter`.

    Raises:
        ValueError: an argument out of range, or a `log_dir` that cannot be made.
        TypeError: an argument of the wrong type.

    Example:

    ```python
    import tempfile
    import keras
    import numpy as np
    import tensorflow as tf
    import keras_scaling

    log_dir = tempfile.mkdtemp()
    strategy = keras_scaling.auto_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    x = np.random.rand(1024, 8).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(
        32, drop_remainder=True)   # static batches, or pass global_batch_size=
    model.fit(
        dataset,
        epochs=3,
        verbose=0,
        callbacks=[
            keras_scaling.ThroughputLogger(log_dir),
            keras.callbacks.TensorBoard(log_dir),
        ],
    )
    # tensorboard --logdir <log_dir>
    ```
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        baseline: float | str | os.PathLike[str] | None = "auto",
        update_freq: int | str = "auto",
        warmup_steps: int | None = None,
        global_batch_size: int | None = None,
        flops_per_sample: float | str | None = "auto",
        peak_flops: float | str | None = "auto",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__()
        self.log_dir = _tensorboard.check_log_dir_can_be_made(log_dir)
        if isinstance(update_freq, str):
            update_freq = _validation.one_of(update_freq, "update_freq", ("auto",))
        else:
            update_freq = _validation.positive_int(
                update_freq, "update_freq", fix='Pass a number of steps or "auto"'
            )
        self.update_freq = update_freq
        self.warmup_steps = (
            DEFAULT_WARMUP_STEPS
            if warmup_steps is None
            else _validation.non_negative_int(warmup_steps, "warmup_steps")
        )
        self.global_batch_size = _validation.optional_positive_int(
            global_batch_size,
            "global_batch_size",
            fix="Pass the samples of one optimizer step over all replicas",
        )
        self._baseline = baseline_lib.resolve_baseline(baseline)
        self.flops_per_sample = utilization_lib.check_flops_per_sample(flops_per_sample)
        self.peak_flops = utilization_lib.check_peak_flops(peak_flops)
        if not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds, got {clock!r}")
        self._clock = clock
        auto = update_freq == "auto"
        self._schedule = ReadSchedule(_AUTO_FLOOR_STEPS if auto else int(update_freq))
        # update_freq="auto": the spacing a timed step allows, once timed.
        self._cost_spacing: int | None = None if auto else int(update_freq)
        # Kept over its fits, set up at the first.
        self._setup: Any = None
        self._flops: Any = None
        self._baseline_note: str | None = None
        self._startup_time_s: float | None = None
        self._stats = ThroughputStats()
        self._epochs: list[tuple[int, SteadyState]] = []
        self._advised: set[str] = set()
        self._window = ThroughputWindow()
        self._fit: Any = None  # a _Fit from on_train_begin
        self._writer: Any = None  # the chief's, from its first fit
        self._step_offset = 0  # added to the step counter in TensorBoard: see _step_offset
        self._compat_applied: list = []
        self._trace_count_undo: Callable[[], None] | None = None
        # `keras-scaling bench` sets it: advice names its options, not Python's.
        self._command_line = False

    # Keras hooks. No batch hook: one would make Keras wait for every step;
    # the work of each step is done around each call of the train function.

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._undo_fit_changes()  # of an earlier fit that did not end here
        self._compat_applied = _enable_compat(model)
        self._trace_count_undo = _trace_count.count_traces(model)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        devices.warn_if_keras_distribution_set()
        info = devices.describe_strategy(self.model.distribute_strategy)
        if info.is_chief:
            # A read-only or full log_dir fails here, not at the first save.
            _validation.writable_directory(self.log_dir, "log_dir", "ThroughputLogger")
        # Finishes a logger (this one too) whose fit raised outside a step.
        _train_function_hook.abandon_other_fits(self.model, self.params)
        _fit_end.end_other_fits(self.params)
        _fit_end.end_fits_when_an_epoch_raises()
        changes = _fit_end.FitChanges(self.params)
        changes.add(self._finish)
        self._compat_applied += _enable_compat(self.model)
        steps_per_epoch = _positive_or_none(self.params.get("steps"))
        epochs = _positive_or_none(self.params.get("epochs"))
        fit = self._fit = _Fit(
            info=info,
            begin_s=self._clock(),
            steps_per_epoch=steps_per_epoch,
            run_steps=steps_per_epoch * epochs if steps_per_epoch and epochs else None,
            changes=changes,
        )
        self._window.close()
        self._schedule.steps_per_execution = int(getattr(self.model, "steps_per_execution", 1) or 1)
        if self.update_freq == "auto":
            self._schedule.every_steps = self._auto_spacing()
        fit.hook = _train_function_hook.TrainFunctionHook(
            self.model,
            after=self._after_execution,
            before=self._before_execution,
            on_error=self._finish,
            owner=self.params,
            on_abandoned=self._finish,
        )
        fit.hook.attach()
        if info.is_chief and self._writer is None:
            self._writer = ThroughputWriter(self.log_dir, self._record)
        self._step_offset = _step_offset(self.model, self.log_dir)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        fit = self._fit
        if fit is None:
            return
        self._window.close()
        fit.executions_until_due = 1
        fit.epoch_stats = ThroughputStats()
        fit.epoch_points = []
        fit.changes.unwatch()  # the fit is alive; Keras drops the last epoch's iterator now
        if fit.hook is not None:
            fit.hook.before = self._before_execution  # the epoch may bring a new iterator
            fit.hook.attach()  # again, in case the train function was rebuilt

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._window.close()
        if self._fit is not None:
            self._fit.executions_until_due = 1

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        steady = self._epoch_steady_state()
        if logs is not None:
            # In every epoch's logs, so that History's lists line up by epoch
            # and CSVLogger, which fixes its columns at the first, has it.
            logs["samples_per_sec"] = math.nan if steady is None else steady.samples_per_sec
        if steady is not None:
            self._epochs.append((epoch, steady))
        self._advise()
        if self._writer is not None:
            self._writer.changed()
            self._writer.save()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._finish()

    # Around each call of the train function.

    def _before_execution(self, iterator):
        fit = self._fit
        fit.changes.watch(iterator)  # freed with fit's frame: the fit is over (`_fit_end`)
        held = fit.iterator()
        if held is None and not fit.finished:
            if fit.element_spec is None:
                fit.element_spec = getattr(iterator, "element_spec", None)
            fit.iterator = _weak_reference(iterator)
            held = iterator
        if held is iterator and fit.hook is not None:
            fit.hook.before = None  # until the next epoch
        if self._setup is None and not fit.finished:
            self._guarded(self._set_up)

    def _after_execution(self):
        fit = self._fit
        fit.executions_until_due -= 1
        if fit.executions_until_due > 0 or fit.finished:
            return
        self._guarded(self._measure if self._window.is_open else self._open_window)
        if not fit.finished:
            fit.executions_until_due = self._schedule.executions_until_due()

    def _guarded(self, step):
        """Runs `step`; a fit whose samples cannot be counted is measured no further."""
        try:
            step()
        except _iterator_plan.GlobalBatchSizeUnknown as error:
            logger.warning("%s ThroughputLogger measures nothing in this fit.", error)
            self._finish()
        except _CounterUnknown:
            self._finish()
        except BaseException:
            self._finish()
            raise

    # Measuring.

    def _read_point(self):
        """`(time_s, iterations, samples)` now; reading the step counter waits for the devices."""
        fit = self._fit
        if fit.counter is None:
            fit.counter = _step_counter.BatchCounter(self.model)
        iterations = fit.counter.read()
        if iterations is None:
            raise _CounterUnknown()
        return dict(
            time_s=self._clock(),
            iterations=iterations,
            samples=iterations * self._setup["global_batch_size"],
        )

    def _open_window(self):
        fit = self._fit
        point = self._read_point()
        warmup_steps = 0
        if not fit.started:
            fit.started = True
            startup_time_s = point["time_s"] - fit.begin_s
            if self._startup_time_s is None:
                self._startup_time_s = startup_time_s
                self._write_setup(point["iterations"] + self._step_offset)
            if self._writer is not None:
                self._writer.scalars(
                    point["iterations"] + self._step_offset,
                    {"throughput/startup_time_s": startup_time_s},
                )
            warmup_steps = self.warmup_steps
            point["time_s"] = self._clock()
        if self.update_freq == "auto" and fit.steps_per_epoch is not None:
            # Every epoch ends on a point. This read follows the epoch's first call.
            first_call_steps = min(self._schedule.steps_per_execution, fit.steps_per_epoch)
            self._schedule.epoch_end_iterations = (
                point["iterations"] - first_call_steps + fit.steps_per_epoch
            )
        self._window.restart(**point, warmup_steps=warmup_steps)
        fit.epoch_points = [point, point]
        fit.traces_at_read = _trace_count.traces(self.model)
        self._schedule.restart(point["iterations"], warmup_steps)

    def _measure(self):
        fit = self._fit
        point = self._read_point()
        fit.epoch_points[-1] = point
        traces = _trace_count.traces(self.model)
        if traces != fit.traces_at_read:  # retraced within this interval: not measured
            fit.traces_at_read = traces
            self._window.restart(**point)
            self._schedule.restart(point["iterations"])
            return
        interval = self._window.update(**point)
        if interval is not None:
            self._add(interval)
            if self._cost_spacing is None:
                self._cost_spacing = auto_update_freq(
                    interval.step_time_s,
                    _AUTO_READ_COST_S,
                    max_share=_AUTO_MAX_SHARE,
                    floor_steps=_AUTO_FLOOR_STEPS,
                )
                self._schedule.every_steps = self._auto_spacing()
        self._schedule.restart(point["iterations"])
        if interval is not None and len(self._stats) == _ADVICE_AFTER_INTERVALS:
            self._advise()
            # The advice may have timed the input pipeline: not training's time.
            self._window.restart(**{**point, "time_s": self._clock()})

    def _add(self, interval):
        samples_per_sec = interval.samples_per_sec
        scalars = {
            "throughput/samples_per_sec": samples_per_sec,
            "throughput/steps_per_sec": interval.steps_per_sec,
            "throughput/per_replica_samples_per_sec": samples_per_sec / self._setup["num_replicas"],
        }
        figures = self._speedup(samples_per_sec)
        if figures is not None:
            scalars["scaling/speedup"] = figures.speedup
            scalars["scaling/efficiency"] = figures.efficiency
            scalars["scaling/ideal_speedup"] = figures.ideal_speedup
        scalars.update(self._flops.scalars(samples_per_sec))
        self._stats.add(interval)
        self._fit.epoch_stats.add(interval)
        if self._writer is not None:
            self._writer.changed()
            self._writer.scalars(interval.end_iterations + self._step_offset, scalars)

    def _epoch_steady_state(self):
        """The epoch's steady state; without an interval of its own, its first read to its last."""
        fit = self._fit
        if fit is None:
            return None
        steady = fit.epoch_stats.steady_state()
        if steady is not None or not fit.epoch_points:
            return steady
        window = ThroughputWindow()
        window.restart(**fit.epoch_points[0])
        interval = window.update(**fit.epoch_points[-1])
        if interval is None:  # no step between them
            return None
        fit.epoch_stats.add(interval)
        return fit.epoch_stats.steady_state()

    def _auto_spacing(self):
        """`update_freq="auto"`: cheap reads, yet a series of points in a short fit."""
        spacing = self._cost_spacing or _AUTO_FLOOR_STEPS
        if self._fit is None or self._fit.run_steps is None:
            return spacing
        return min(
            spacing, spacing_for_points(self._fit.run_steps, self._schedule.steps_per_execution)
        )

    def _speedup(self, samples_per_sec):
        if self._baseline is None:
            return None
        return self._baseline.speedup(samples_per_sec, self._setup["num_replicas"])

    # Set-up: before the first step of the logger's first fit.

    def _set_up(self):
        fit, info = self._fit, self._fit.info
        start_s = self._clock()
        global_batch_size = _iterator_plan.global_batch_size(
            self.global_batch_size, fit.iterator(), fit.element_spec, info.num_replicas
        )
        per_replica_batch_size = global_batch_size // info.num_replicas
        spec = _throughput_flops.one_replica_spec(fit.element_spec, per_replica_batch_size)
        policy = getattr(self.model, "dtype_policy", None)
        setup = {
            "strategy": info.kind,
            "num_workers": info.num_workers,
            "num_replicas": info.num_replicas,
            "device_kind": info.device_kind,
            "per_replica_batch_size": per_replica_batch_size,
            "global_batch_size": global_batch_size,
            "dtype_policy": getattr(policy, "name", str(policy)),
        }
        self._baseline, self._baseline_note = baseline_lib.for_run(
            self._baseline,
            setup,
            model=self.model,
            one_replica_spec=spec,
            device=info.local_devices[0],
            measures=info.is_chief,
            shared_cores=(
                info.device_kind == "CPU"
                and info.replicas_per_worker > 1
                and os.environ.get(_THREADPOOL_ENV) != "1"
            ),
        )
        if info.is_chief:
            self._flops = _throughput_flops.resolve(
                self.model,
                flops_per_sample=self.flops_per_sample,
                peak_flops=self.peak_flops,
                one_replica_spec=spec,
                setup=setup,
                device=info.local_devices[0],
                command_line=self._command_line,
            )
        else:
            self._flops = _throughput_flops.ModelFlops(num_replicas=info.num_replicas)
        self._setup = setup
        fit.begin_s += self._clock() - start_s  # the start-up time leaves the set-up out

    def _write_setup(self, step):
        if self._writer is None:
            return
        self._writer.changed()
        self._writer.layout(flops_tag=self._flops.flops_tag, mfu=self._flops.has_mfu)
        texts = dashboard.setup_texts(
            self._setup,
            steps_per_execution=self._schedule.steps_per_execution,
            update_freq=self.update_freq,
            warmup_steps=self.warmup_steps,
            flops_rows=self._flops.setup_rows(),
            baseline=self._baseline,
            note=self._baseline_note,
            log_dir=self.log_dir,
        )
        for tag, markdown in texts.items():
            self._writer.text(step, tag, markdown)

    # Writing, and the end of a fit.

    def _record(self):
        """The `throughput.json` record so far, or None before the set-up."""
        if self._setup is None:
            return None
        steady = self._stats.steady_state()
        samples_per_sec = steady.samples_per_sec if steady is not None else None
        baseline_fields = {}
        if self._baseline is not None:
            baseline_fields = self._baseline.record_fields(samples_per_sec)
        return _run_record.build_record(
            self._setup,
            steady=steady,
            startup_time_s=self._startup_time_s,
            epochs=self._epochs,
            flops=self._flops.record_fields(samples_per_sec),
            **baseline_fields,
        )

    # Keras skips on_train_end when fit raises: `_fit_end` finishes it then.

    def _finish(self):
        fit = self._fit
        if fit is None or fit.finished:
            return
        fit.finished = True
        try:
            if self._writer is not None:
                _remember_steps(self.model, self.log_dir, self._step_offset, self._writer.last_step)
                self._writer.stop()  # may raise: a full disk, for one
        finally:
            if fit.hook is not None:
                fit.hook.detach()
                fit.hook = None
            self._undo_fit_changes()
        if self._setup is not None and not self._stats and fit.info.is_chief:
            logger.warning(
                "ThroughputLogger: no step was measured (warm-up: first execution "
                "+ %d steps, then a figure every %d steps); %s has no throughput. "
                "Train for more steps, or lower warmup_steps or update_freq.",
                self.warmup_steps,
                self._schedule.every_steps,
                _run_record.THROUGHPUT_JSON,
            )
        fit.iterator = lambda: None

    def _undo_fit_changes(self):
        """Puts back `train_step` and the Keras fixes this logger enabled on its own."""
        undo, self._trace_count_undo = self._trace_count_undo, None
        if undo is not None:
            undo()
        applied, self._compat_applied = self._compat_applied, []
        if applied:
            from keras_scaling import compat

            compat._restore(applied)

    # Advice: each kind logged and written to the Text dashboard once.

    def _advise(self):
        fit = self._fit
        if len(self._stats) < _ADVICE_AFTER_INTERVALS or fit is None or not fit.info.is_chief:
            return
        steady = self._stats.steady_state()
        assert steady is not None  # intervals were measured
        for kind, text in advice_lib.due(
            self._advised,
            steady=steady,
            figures=self._speedup(steady.samples_per_sec),
            steps_per_execution=self._schedule.steps_per_execution,
            host_cpu_replicas=(
                self._setup["device_kind"] == "CPU" and fit.info.replicas_per_worker > 1
            ),
            utilization=self._flops.utilization(steady.samples_per_sec),
            per_replica_batch_size=self._setup["per_replica_batch_size"],
            compute_dtype=_throughput_flops.compute_dtype(self.model),
            faster_dtypes=self._flops.faster_dtypes,
            input_samples_per_sec=self._input_samples_per_sec,
        ):
            self._advised.add(kind)
            logger.warning("ThroughputLogger: %s", text)
            self._writer.text(self._writer.last_step, dashboard.ADVICE_TAG, text)

    def _input_samples_per_sec(self):
        """The input pipeline's samples/sec over all workers, or (None, why not)."""
        samples_per_sec, reason = _input_timing.input_samples_per_sec(self._fit.iterator())
        if samples_per_sec is not None:
            samples_per_sec *= self._setup["num_workers"]
        return samples_per_sec, reason


def _positive_or_none(value):
    """An int from Keras' `params`, or None when unknown."""
    try:
        value = int(value)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def _weak_reference(iterator):
    """A callable returning `iterator` while it lives, then None."""
    try:
        return weakref.ref(iterator)
    except TypeError:  # a type without weak references: held until the fit ends
        return lambda: iterator


def _enable_compat(model):
    from keras_scaling import compat

    return compat._enable_for_quietly(model.distribute_strategy)
