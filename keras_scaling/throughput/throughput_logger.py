"""`ThroughputLogger`: throughput, speedup and scaling efficiency in TensorBoard."""

import atexit
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras

from keras_scaling import _validation, devices
from keras_scaling.data import _iterator_plan
from keras_scaling.devices import _topology
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
    ThroughputStats,
    ThroughputWindow,
    auto_update_freq,
    spacing_for_points,
)

if TYPE_CHECKING:
    from keras_scaling.throughput import SteadyState

__all__ = ["ThroughputLogger"]


class _CounterUnknown(Exception):
    """The batches trained cannot be read in this fit."""


logger = logging.getLogger("keras_scaling")

DEFAULT_WARMUP_STEPS = 5
# update_freq="auto": reads of the step counter take at most this share of
# the measured step time, and are at least this many steps apart. A read
# also idles the devices while the next step is dispatched, which on steps
# of a millisecond costs about twice the read's own time again.
_AUTO_MAX_SHARE = 0.001
_AUTO_FLOOR_STEPS = 10
_ADVICE_AFTER_INTERVALS = 3
# Set before TensorFlow starts, each logical CPU has a thread pool of its own
# (tensorflow/core/common_runtime/local_device.cc), as `keras-scaling bench` does.
_THREADPOOL_ENV = "TF_OVERRIDE_GLOBAL_THREADPOOL"


class ThroughputLogger(keras.callbacks.Callback):
    """Writes throughput, speedup and scaling efficiency to TensorBoard.

    Scalars go to keras_scaling's run directory under `log_dir`, beside the
    loss that `keras.callbacks.TensorBoard(log_dir)` writes, with the
    optimizer's `iterations` as the step:

    | tag | meaning |
    |---|---|
    | `throughput/samples_per_sec` | samples trained per second over the interval, all replicas together |
    | `throughput/steps_per_sec` | optimizer steps per second |
    | `throughput/per_replica_samples_per_sec` | `samples_per_sec / replicas` |
    | `throughput/startup_time_s` | seconds from the start of `fit` to the end of its first execution (tracing included) |
    | `scaling/speedup` | `samples_per_sec / baseline` (the baseline: one replica, same per-replica batch) |
    | `scaling/ideal_speedup` | replicas divided by the baseline's replicas (1 unless a file says otherwise) |
    | `scaling/efficiency` | `speedup / ideal_speedup`; 1.0 is perfect scaling |
    | `throughput/tflops_per_sec` | model TFLOP/s, all replicas: `flops_per_sample * samples_per_sec / 1e12` (GPUs, TPUs) |
    | `throughput/gflops_per_sec` | the same in GFLOP/s (`/ 1e9`), on CPUs |
    | `throughput/per_replica_tflops_per_sec` | `tflops_per_sec / replicas` (`per_replica_gflops_per_sec` on CPUs) |
    | `throughput/mfu` | model FLOPs utilization: achieved FLOP/s / (peak FLOP/s of one replica x replicas) |

    Efficiency and MFU are fractions (1.0 is perfect) here, in the terminal
    and in `throughput.json`. Besides the scalars: Custom Scalars charts
    (speedup against ideal first, then efficiency, samples/sec and, where
    they can have points, model FLOP/s and MFU), and in the Text dashboard
    the set-up in three short tables (the run, the baseline, how it is
    measured) and the advice given.

    How it measures:

    - Samples are counted as the batches trained (the optimizer's step
      counter, which counts every batch, also with
      `gradient_accumulation_steps`) times the global batch, so `steps_per_execution` > 1, a partial last execution, several
      `fit` calls and resumed runs count right. The global batch is
      `global_batch_size` when given, else the plan of a dataset made by
      `keras_scaling.data.distribute`, else the data's static batch size times
      the replicas. When none is known (arrays or a dataset with a partial
      last batch), it says so once and measures nothing in that `fit`: pass
      `global_batch_size=`.
    - The counter is read (which waits for the devices to finish their work)
      at every multiple of `update_freq` steps, so points fall on regular
      steps. `"auto"` starts at 10 steps and, after the first measured
      interval, widens the spacing to a round number of steps at which the
      reads take at most 0.1% of the measured step time (a read also idles
      the devices while the next step is dispatched: on steps of about a
      millisecond, measuring costs at most about 0.3% in all). So that a
      short fit still draws a series, `"auto"` reads at least every twelfth
      of the fit's steps (`keras_scaling.throughput.spacing_for_points`),
      and at the last step of every epoch of known length, so that every
      epoch has its figure.
    - Only time between train batches of one epoch counts: validation,
      checkpoints saved at the end of an epoch and the first execution of
      every epoch are left out. The first execution of each `fit` call,
      `warmup_steps` more steps, and any interval in which the step function
      was traced again are warm-up, not measured; the start-up time is logged
      on its own.
    - Steps never repeat: a step already written (by this or an earlier run,
      before a `BackupAndRestore` resume) is not written again.
    - `samples_per_sec` of each epoch, the steady state (median step) of that
      epoch's intervals, is added to every epoch's logs, so the progress bar,
      `History`, `CSVLogger` and Keras' `TensorBoard` (as
      `epoch_samples_per_sec`) show it; put those callbacks after this one.
      An epoch with no interval of its own (all warm-up, say) gets its
      samples over its time from the end of its first call of the train
      function to its last read, warm-up included; one with no read after
      that call (a single call, an int `update_freq` longer than the epoch,
      nothing measured in the fit) gets NaN.
      The same figure, unless NaN, is the epoch's entry in `throughput.json`.
    - `log_dir/throughput.json` (steady-state median samples/sec over the
      whole run, step time percentiles, set-up, baseline, speedup, ideal and
      efficiency, each epoch's figure) is written before `fit` returns. While
      it trains, a background thread writes the set-up to the event file at
      once, the new points about a second after each new figure, and rewrites
      `throughput.json` a second after each epoch and every 2 seconds
      while figures change, so `fit`'s loop does no file writes and nothing
      measured is lost however training stops (another callback raising,
      Ctrl-C, a notebook that lives on).
    - Under `MultiWorkerMirroredStrategy` only the chief writes, and the
      figure is the measured global throughput: all workers step together,
      so global batch times steps over the chief's wall time.
    - Advice is given once each, on the `keras_scaling` logger and in the
      Text dashboard (`throughput/advice`): very short steps (use
      `steps_per_execution`), efficiency below 0.8 (whether the input
      pipeline, timed alone, or the combining of updates is the likelier
      cause), well-scaling but underused devices.

    Baselines: a number is the samples/sec of one replica. A path to an
    earlier run's `log_dir` or `throughput.json` takes its figure (with a
    warning when its per-replica batch, dtype policy or device kind
    differs). `"measure"` times a copy of the model (`clone_model`, same
    compile config) alone on the first device on synthetic batches of one
    replica's size before the first measured step, without touching the
    trained model, once per model, batch and device in a process. On logical CPUs that copy has all of the host's cores
    while the replicas share them, so speedup reads low; a warning and the
    set-up table say so and point to `keras-scaling bench`. `"auto"` is the
    run itself with one replica (speedup 1.0) and `"measure"` with several.
    None writes no `scaling/` tags.

    Model FLOPs and MFU: `flops_per_sample="auto"` counts the operations of
    one training sample once, before the first measured step, from the
    traced graph of the model's loss and gradients
    (`keras_scaling.flops.training_flops_per_sample`); models it cannot
    count (RNN loops, ops without statistics) get no `tflops` or `mfu`
    tags, with the reason logged once. `peak_flops="auto"` looks one
    replica's device up in `keras_scaling.peak_flops.PEAK_FLOPS` (GPUs by
    name, TPUs by accelerator type, for the dtype policy's compute dtype);
    an unknown device logs once that MFU needs `peak_flops=`. `"measure"`
    times a large matrix multiply on one device (for CPUs). A number is
    taken as given; None turns either off. When efficiency is high but MFU
    low, the advice says whether the input, the dtype or the per-replica
    batch is the likelier cause.

    Args:
        log_dir: str or path, the run's log directory, as given to
            `keras.callbacks.TensorBoard`.
        baseline: a number, a path, `"measure"`, `"auto"` or None; default
            `"auto"`.
        update_freq: `"auto"` (the default) or an int, optimizer steps
            between reads of the step counter and so between points.
        warmup_steps: int, steps after the first execution of each `fit`
            call that are not measured; default None means 5.
        global_batch_size: int, samples per optimizer step over all replicas;
            default None reads it from the data (see above).
        flops_per_sample: `"auto"`, a positive number (floating-point
            operations of one sample, forward and backward) or None; default
            `"auto"`.
        peak_flops: `"auto"`, `"measure"`, a positive number (peak FLOPs/sec
            of one replica's device) or None; default `"auto"`.
        clock: callable returning seconds, default `time.perf_counter`; a
            test can pass a clock of its own.

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
        self._schedule = ReadSchedule(
            _AUTO_FLOOR_STEPS if isinstance(update_freq, str) else update_freq
        )
        self._calibrated = update_freq != "auto"
        # update_freq="auto": the spacing that keeps reads cheap, once measured.
        self._cost_spacing = _AUTO_FLOOR_STEPS
        self._run_steps = None
        self._steps_per_epoch = None
        self._stats = ThroughputStats()
        self._epoch_stats = ThroughputStats()
        # The epoch's first and last reads of the step counter.
        self._epoch_points: list[dict[str, Any]] = []
        self._window = ThroughputWindow()
        self._epochs: list[tuple[int, SteadyState]] = []
        # Set at the first measurement of a fit (Any: mypy cannot see that
        # the methods that use them run only after it).
        self._setup: Any = None
        self._flops: Any = None
        self._startup_time_s: float | None = None
        self._baseline_note: str | None = None
        self._advised: set[str] = set()
        self._finished = True
        self._hook: _train_function_hook.TrainFunctionHook | None = None
        self._executions_until_due = 1  # a closed window opens at the next call
        # Held while figures change and while the writer's thread takes them.
        self._lock = threading.RLock()
        self._writer: Any = None  # the chief's, once the first fit starts
        # `keras-scaling bench` sets it: advice names its options, not Python's.
        self._command_line = False

    # Keras hooks: gather inputs, hand them to the core and the writers. There
    # is no batch hook (see `_train_function_hook`): the work of each step is
    # done after each call of the train function.

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._undo_fit_changes()  # of an earlier fit that did not end here
        self._compat_applied = _enable_compat(model)
        self._trace_count_undo = _trace_count.count_traces(model)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        devices.warn_if_keras_distribution_set()
        if _topology.is_chief(self.model.distribute_strategy):
            # A read-only or full log_dir fails here, not at the first save.
            _validation.writable_directory(self.log_dir, "log_dir", "ThroughputLogger")
        # Finishes a logger (this one too) whose fit raised outside a step.
        _train_function_hook.abandon_other_fits(self.model, self.params)
        _fit_end.end_other_fits(self.params)
        self._changes = _fit_end.FitChanges(self.params)
        self._changes.add(self._finish)
        self._compat_applied += _enable_compat(self.model)
        self._info = devices.describe_strategy(self.model.distribute_strategy)
        self._train_begin_s = self._clock()
        self._fit_started = False
        self._finished = False
        self._window.close()
        self._executions_until_due = 1
        self._schedule.steps_per_execution = int(getattr(self.model, "steps_per_execution", 1) or 1)
        self._steps_per_epoch = _positive_or_none(self.params.get("steps"))
        epochs = _positive_or_none(self.params.get("epochs"))
        self._run_steps = (
            self._steps_per_epoch * epochs if self._steps_per_epoch and epochs else None
        )
        if self.update_freq == "auto":
            self._schedule.every_steps = self._auto_spacing()
        self._batch_counter: _step_counter.BatchCounter | None = None
        self._element_spec = None
        self._iterator = _no_iterator
        self._hook = _train_function_hook.TrainFunctionHook(
            self.model,
            after=self._after_execution,
            before=self._see_iterator,
            on_error=self._finish,
            owner=self.params,
            on_abandoned=self._finish,
        )
        self._hook.attach()
        atexit.register(self._finish_at_exit)
        if self._info.is_chief:
            if self._writer is None:
                self._writer = ThroughputWriter(self.log_dir, self._record, self._lock)
            self._writer.start()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if getattr(self, "_changes", None) is not None:
            # The fit is alive; Keras drops the last epoch's iterator now.
            self._changes.unwatch()
        self._window.close()
        self._executions_until_due = 1
        self._epoch_stats = ThroughputStats()
        self._epoch_points = []
        if self._hook is not None:
            self._hook.before = self._see_iterator  # the epoch may bring a new iterator
            self._hook.attach()  # again, in case the train function was rebuilt

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._window.close()
        self._executions_until_due = 1

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        steady = self._epoch_stats.steady_state() or self._whole_epoch()
        if logs is not None:
            # In every epoch's logs, so that History's lists line up by epoch
            # and CSVLogger, which fixes its columns at the first, has it.
            logs["samples_per_sec"] = math.nan if steady is None else steady.samples_per_sec
        if steady is not None:
            with self._lock:
                self._epochs.append((epoch, steady))
        self._advise()
        if self._writer is not None:
            with self._lock:
                self._writer.changed(epoch_ended=True)
            self._writer.save_soon()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._finish()

    # Around each call of the train function.

    def _see_iterator(self, iterator):
        # Held weakly: each epoch's iterator is freed when Keras drops it, as
        # it would be without this callback. Freeing an iterator can wait up
        # to a minute for tf.data's autotuning thread to wake.
        if getattr(self, "_changes", None) is not None:
            self._changes.watch(iterator)  # freed by Python: the fit is over
        held = self._iterator()
        if held is None and not self._finished:
            if self._element_spec is None:
                self._element_spec = getattr(iterator, "element_spec", None)
            self._iterator = _weak_reference(iterator)
            held = iterator
        if held is iterator and self._hook is not None:
            self._hook.before = None  # until the next epoch

    def _after_execution(self):
        # Between reads, a call costs a decrement: the schedule says how
        # many calls on the next read is due.
        self._executions_until_due -= 1
        if self._executions_until_due > 0 or self._finished:
            return
        if not self._window.is_open:
            self._open_window_or_finish()
        else:
            self._measure()
        if not self._finished:
            self._executions_until_due = self._schedule.executions_until_due()

    # Measuring.

    def _read_iterations(self):
        """The batches trained so far (the step counter); reading it waits for the devices."""
        if self._batch_counter is None:
            self._batch_counter = _step_counter.BatchCounter(self.model)
        batches = self._batch_counter.read()
        if batches is None:
            raise _CounterUnknown()
        return batches

    def _samples(self, iterations):
        return iterations * self._setup["global_batch_size"]

    def _open_window_or_finish(self):
        try:
            self._open_window()
        except _iterator_plan.GlobalBatchSizeUnknown as error:
            # Training goes on; only the figures that need it are lost.
            logger.warning("%s ThroughputLogger measures nothing in this fit.", error)
            self._finish()
        except _CounterUnknown:
            # The probe of the step counter has said what is lost.
            self._finish()
        except BaseException:
            self._finish()
            raise

    def _open_window(self):
        iterations = self._read_iterations()
        now_s = self._clock()
        warmup_steps = 0
        if not self._fit_started:
            self._fit_started = True
            startup_time_s = now_s - self._train_begin_s
            if self._setup is None:
                self._startup_time_s = startup_time_s
                self._set_up(iterations)
            self._write({"throughput/startup_time_s": startup_time_s}, iterations)
            warmup_steps = self.warmup_steps
            now_s = self._clock()
        if self.update_freq == "auto" and self._steps_per_epoch is not None:
            # Every epoch ends on a point, so that each has its figure. This
            # read is after the epoch's first call of the train function.
            first_call_steps = min(self._schedule.steps_per_execution, self._steps_per_epoch)
            self._schedule.epoch_end_iterations = (
                iterations - first_call_steps + self._steps_per_epoch
            )
        point = dict(time_s=now_s, iterations=iterations, samples=self._samples(iterations))
        self._window.restart(**point, warmup_steps=warmup_steps)
        self._epoch_points = [point, point]
        self._traces_at_read = _trace_count.traces(self.model)
        self._schedule.restart(iterations, warmup_steps)

    def _measure(self):
        read_start_s = None if self._calibrated else self._clock()
        iterations = self._read_iterations()
        now_s = self._clock()
        traces = _trace_count.traces(self.model)
        point = dict(time_s=now_s, iterations=iterations, samples=self._samples(iterations))
        self._epoch_points[-1] = point
        if traces != self._traces_at_read:
            # The step function was traced again within this interval.
            self._traces_at_read = traces
            self._window.restart(**point)
            self._schedule.restart(iterations)
            return
        interval = self._window.update(**point)
        if interval is not None:
            self._add(interval)
            if not self._calibrated:
                self._calibrate(interval.step_time_s, read_start_s, work_start_s=now_s)
        self._schedule.restart(iterations)
        if interval is not None and len(self._stats) == _ADVICE_AFTER_INTERVALS:
            self._advise()
            # The advice may have timed the input pipeline: the next interval
            # starts after it, so its time is not counted as training's.
            self._window.restart(
                time_s=self._clock(), iterations=iterations, samples=point["samples"]
            )

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
        with self._lock:
            self._stats.add(interval)
            self._epoch_stats.add(interval)
            if self._writer is not None:
                self._writer.changed()
        self._write(scalars, interval.end_iterations)

    def _whole_epoch(self):
        """An epoch with no measured interval: its `SteadyState` from its first read to its last, or None."""
        if not self._epoch_points:
            return None
        window = ThroughputWindow()
        window.restart(**self._epoch_points[0])
        interval = window.update(**self._epoch_points[-1])
        if interval is None:  # no step between them
            return None
        self._epoch_stats.add(interval)
        return self._epoch_stats.steady_state()

    def _calibrate(self, step_time_s, read_start_s, work_start_s):
        """Spaces the reads of `update_freq="auto"` by what one measurement costs.

        A measurement costs its read of the step counter and the work after
        it. Where the devices are done when the train function returns (CPU),
        the measurement's own read costs what a read costs. Elsewhere that
        read also waits for the devices' queued work, which is training, not
        cost, so a second read right after it is timed.
        """
        self._calibrated = True
        work_s = self._clock() - work_start_s
        if _topology.work_done_on_return(self._info.device_kind):
            read_s = work_start_s - read_start_s
        else:
            read_start_s = self._clock()
            self._read_iterations()
            read_s = self._clock() - read_start_s
        self._cost_spacing = auto_update_freq(
            step_time_s,
            work_s + read_s,
            max_share=_AUTO_MAX_SHARE,
            floor_steps=_AUTO_FLOOR_STEPS,
        )
        self._schedule.every_steps = self._auto_spacing()

    def _auto_spacing(self):
        """`update_freq="auto"`'s spacing: cheap reads, yet a series of points in a short fit."""
        if self._run_steps is None:
            return self._cost_spacing
        return min(
            self._cost_spacing,
            spacing_for_points(self._run_steps, self._schedule.steps_per_execution),
        )

    def _speedup(self, samples_per_sec):
        """`Speedup` of a throughput figure, or None without a baseline."""
        if self._baseline is None:
            return None
        return self._baseline.speedup(samples_per_sec, self._setup["num_replicas"])

    # Set-up: batch sizes, baseline, FLOPs, and the set-up table.

    def _set_up(self, iterations):
        info = self._info
        global_batch_size = _iterator_plan.global_batch_size(
            self.global_batch_size, self._iterator(), self._element_spec, info.num_replicas
        )
        per_replica_batch_size = global_batch_size // info.num_replicas
        spec = _throughput_flops.one_replica_spec(self._element_spec, per_replica_batch_size)
        policy = getattr(self.model, "dtype_policy", None)
        self._setup = {
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
            self._setup,
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
        if not info.is_chief:
            self._flops = _throughput_flops.ModelFlops(num_replicas=info.num_replicas)
            return
        self._flops = _throughput_flops.resolve(
            self.model,
            flops_per_sample=self.flops_per_sample,
            peak_flops=self.peak_flops,
            one_replica_spec=spec,
            setup=self._setup,
            device=info.local_devices[0],
            command_line=self._command_line,
        )
        run_rows = [
            ("strategy", info.kind),
            ("workers", info.num_workers),
            ("replicas", info.num_replicas),
            ("device kind", info.device_kind),
            ("per-replica batch", self._setup["per_replica_batch_size"]),
            ("global batch", global_batch_size),
            ("dtype policy", self._setup["dtype_policy"]),
            ("steps per execution", self._schedule.steps_per_execution),
        ]
        measuring_rows = [
            ("measured every", dashboard.measured_every_text(self.update_freq)),
            ("left out", f"the first execution of each fit and {self.warmup_steps} steps after it"),
            *self._flops.setup_rows(),
        ]
        with self._lock:
            self._writer.changed()
        self._writer.layout(flops_tag=self._flops.flops_tag, mfu=self._flops.has_mfu)
        self._writer.text(iterations, dashboard.SETUP_TAG, dashboard.setup_markdown(run_rows))
        self._writer.text(
            iterations,
            dashboard.BASELINE_TAG,
            dashboard.baseline_markdown(
                dashboard.baseline_text(self._baseline, self.log_dir),
                self._baseline_note,
                _baseline_time_text(self._baseline),
            ),
        )
        self._writer.text(
            iterations,
            dashboard.MEASURING_TAG,
            dashboard.setup_markdown(measuring_rows, heading="measuring"),
        )

    # Writing and saving.

    def _write(self, scalars, step):
        if self._writer is not None:
            self._writer.scalars(step, scalars)

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

    # Keras does not call on_train_end when fit raises (it has no
    # try/finally): the train function's hook finishes when a step raises,
    # Ctrl-C included; the writer's thread and atexit cover an error raised
    # elsewhere, and the next fit of the model finishes what was left.

    def _finish(self):
        if self._finished:
            return
        self._finished = True
        try:
            if self._writer is not None:
                self._writer.stop()  # may raise: a full disk, for one
        finally:
            if self._hook is not None:
                self._hook.detach()
                self._hook = None
            self._undo_fit_changes()
        atexit.unregister(self._finish_at_exit)
        if self._setup is not None and not self._stats and self._info.is_chief:
            logger.warning(
                "ThroughputLogger: no step was measured (warm-up: first execution "
                "+ %d steps, then a figure every %d steps); %s has no throughput. "
                "Train for more steps, or lower warmup_steps or update_freq.",
                self.warmup_steps,
                self._schedule.every_steps,
                _run_record.THROUGHPUT_JSON,
            )
        self._iterator = _no_iterator

    def _undo_fit_changes(self):
        """Puts back `train_step` and the Keras functions this logger patched on its own."""
        undo, self._trace_count_undo = getattr(self, "_trace_count_undo", None), None
        if undo is not None:
            undo()
        applied, self._compat_applied = getattr(self, "_compat_applied", []), []
        if applied:
            from keras_scaling import compat

            compat._restore(applied)

    def _finish_at_exit(self):
        try:
            self._finish()
        except Exception:
            logger.exception("ThroughputLogger: could not save at exit")

    # Advice: the sentences are _throughput_advice's; each is logged and
    # written to the Text dashboard once.

    def _advise(self):
        if len(self._stats) < _ADVICE_AFTER_INTERVALS or not self._info.is_chief:
            return
        steady = self._stats.steady_state()
        assert steady is not None  # intervals were measured
        for kind, text in advice_lib.due(
            self._advised,
            steady=steady,
            figures=self._speedup(steady.samples_per_sec),
            steps_per_execution=self._schedule.steps_per_execution,
            host_cpu_replicas=(
                self._setup["device_kind"] == "CPU" and self._info.replicas_per_worker > 1
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
        samples_per_sec, reason = _input_timing.input_samples_per_sec(self._iterator())
        if samples_per_sec is not None:
            samples_per_sec *= self._setup["num_workers"]
        return samples_per_sec, reason


def _no_iterator():
    return None


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


def _baseline_time_text(baseline):
    """The set-up table's time of timing the baseline's copy, or None when none was timed."""
    seconds = getattr(baseline, "measure_time_s", None)
    if seconds is None:
        return None
    return f"{seconds:.1f} s, timing a copy of the model alone before training went on"
