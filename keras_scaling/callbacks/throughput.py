"""`ThroughputLogger`: throughput, speedup and scaling efficiency in TensorBoard."""

import atexit
import logging
import math
import sys
import time

import keras
import tensorflow as tf

from keras_scaling import _keras_internals
from keras_scaling import _tf_data_internals
from keras_scaling import _tensorboard
from keras_scaling import baseline as baseline_lib
from keras_scaling import devices
from keras_scaling import utilization as utilization_lib
from keras_scaling.throughput import ThroughputStats, ThroughputWindow, scaling

logger = logging.getLogger("keras_scaling")

_SCALAR_TAGS = frozenset({
    "throughput/samples_per_sec",
    "throughput/steps_per_sec",
    "throughput/samples_per_sec_per_replica",
    "throughput/startup_time_s",
    "scaling/speedup",
    "scaling/efficiency",
    "scaling/ideal_speedup",
    "throughput/tflops_per_sec",
    "throughput/tflops_per_sec_per_replica",
    "throughput/mfu",
})
DEFAULT_WARMUP_STEPS = 5
# Steps shorter than this are dominated by the training loop's fixed cost per
# call (Python, callbacks, dispatch), which steps_per_execution amortises.
_SHORT_STEP_S = 0.005
_LOW_EFFICIENCY = 0.8
_ADVICE_AFTER_INTERVALS = 3
_INPUT_PROBE_BATCHES = 20
_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc", "GeneratorDataset"})
# A device without a peak figure is named once per process, not once per fit.
_PEAK_REASONS_LOGGED = set()


class ThroughputLogger(keras.callbacks.Callback):
    """Writes throughput, speedup and scaling efficiency to TensorBoard.

    Scalars go to `log_dir/train`, beside the loss that
    `keras.callbacks.TensorBoard(log_dir)` writes, with the optimizer's
    `iterations` as the step:

    | tag | meaning |
    |---|---|
    | `throughput/samples_per_sec` | samples trained per second, all replicas together |
    | `throughput/steps_per_sec` | optimizer steps per second |
    | `throughput/samples_per_sec_per_replica` | `samples_per_sec / replicas` |
    | `throughput/startup_time_s` | seconds from the start of `fit` to the end of its first execution (tracing included) |
    | `scaling/speedup` | `samples_per_sec / baseline` (the baseline: one replica, same per-replica batch) |
    | `scaling/ideal_speedup` | replicas (divided by the baseline's replicas, 1 unless a file says otherwise) |
    | `scaling/efficiency` | `speedup / ideal_speedup`; 1.0 is perfect scaling |
    | `throughput/tflops_per_sec` | model TFLOP/s, all replicas: `flops_per_sample * samples_per_sec / 1e12` |
    | `throughput/tflops_per_sec_per_replica` | `tflops_per_sec / replicas` |
    | `throughput/mfu` | model FLOPs utilization: achieved FLOPs/sec / (peak FLOPs/sec of one replica x replicas) |

    plus a Custom Scalars chart of speedup against ideal, and a text summary
    of the set-up (strategy, workers, replicas, batch sizes, baseline).

    How it measures:

    - Samples are counted from the optimizer's `iterations` times the global
      batch, so `steps_per_execution` > 1, a partial last execution, several
      `fit` calls and resumed runs count right. The global batch is
      `global_batch_size` when given, else the plan of a dataset made by
      `keras_scaling.data.distribute`, else the data's static batch size times
      the replicas, else the `batch_size` given to `fit` with arrays; when none
      is known, the first step raises and says so.
    - The counter is read (which waits for the devices to finish their work)
      once every `update_freq` steps and at the last step of each epoch (when
      Keras knows the epoch's length), so the overhead stays small.
    - Only time between train batches of one epoch counts: validation,
      checkpoints saved at the end of an epoch and the first execution of
      every epoch are left out. The first execution of each `fit` call,
      `warmup_steps` more steps, and any interval in which the step function
      was traced again are warm-up, not measured; the start-up time is logged
      on its own.
    - Steps never repeat: a step already written to `log_dir/train` (by this
      or an earlier run, before a `BackupAndRestore` resume) is not written
      again.
    - `samples_per_sec` of each epoch is added to the epoch logs, so the
      progress bar, `History` and `CSVLogger` show it (put `CSVLogger` after
      this callback).
    - The event files are flushed and `log_dir/throughput.json` is written
      (steady-state median samples/sec, step time percentiles, set-up,
      baseline, speedup and efficiency) at the end of training and of every
      epoch, and when training stops by an exception: Keras then skips
      `on_train_end`, so it is done when a training step raises (Ctrl-C
      included), and for an error raised elsewhere (another callback) when
      the model trains again or at exit, whichever comes first.
    - Under `MultiWorkerMirroredStrategy` only the chief writes, and the
      figure is the measured global throughput: all workers step together,
      so global batch times steps over the chief's wall time.
    - Advice is logged once each on the `keras_scaling` logger: very short
      steps (use `steps_per_execution`), and efficiency below 0.8 (whether
      the input pipeline, timed alone, or the combining of updates is the
      likelier cause).

    Baselines: a number is the samples/sec of one replica. A path to an
    earlier run's `log_dir` or `throughput.json` takes its figure (with a
    warning when its per-replica batch, dtype policy or device kind
    differs). `"measure"` times a copy of the model (`clone_model`, same
    compile config) alone on the first device on synthetic batches of one
    replica's size before the first measured step, without touching the
    trained model. `"auto"` is the run itself with one replica (speedup 1.0)
    and `"measure"` with several. None writes no `scaling/` tags.

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
        update_freq: int, optimizer steps between writes; default 10.
        warmup_steps: int, steps after the first execution of each `fit`
            call that are not measured; default None means 5.
        global_batch_size: int, samples per optimizer step over all replicas;
            default None reads it from the data (see above).
        flops_per_sample: `"auto"`, a positive number (floating-point
            operations of one sample, forward and backward) or None; default
            `"auto"`.
        peak_flops: `"auto"`, `"measure"`, a positive number (peak FLOPs/sec
            of one replica's device) or None; default `"auto"`.

    Example:

    ```python
    strategy = keras_scaling.auto_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    model.fit(
        dataset,   # batches of a known size, or pass global_batch_size=
        epochs=3,
        callbacks=[
            keras_scaling.ThroughputLogger("runs/a"),
            keras.callbacks.TensorBoard("runs/a"),
        ],
    )
    # tensorboard --logdir runs
    ```
    """

    def __init__(self, log_dir, *, baseline="auto", update_freq=10,
                 warmup_steps=None, global_batch_size=None,
                 flops_per_sample="auto", peak_flops="auto"):
        super().__init__()
        self.log_dir = _tensorboard.check_log_dir(log_dir)
        self.update_freq = _positive_int(update_freq, "update_freq")
        if warmup_steps is None:
            warmup_steps = DEFAULT_WARMUP_STEPS
        elif isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int):
            raise TypeError(f"warmup_steps must be an int or None, got {warmup_steps!r}")
        elif warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        if global_batch_size is not None:
            global_batch_size = _positive_int(global_batch_size, "global_batch_size")
        self.global_batch_size = global_batch_size
        self._baseline = baseline_lib.resolve_baseline(baseline)
        self.flops_per_sample = utilization_lib.check_flops_per_sample(flops_per_sample)
        self.peak_flops = utilization_lib.check_peak_flops(peak_flops)
        self._flops = None
        self._clock = time.perf_counter
        self._stats = ThroughputStats()
        self._window = ThroughputWindow()
        self._setup = None
        self._startup_time_s = None
        self._last_written_step = None
        self._advised = set()
        self._finished = True
        self._guard = None

    # Keras hooks: gather inputs, hand them to the core and the writers.

    def set_model(self, model):
        super().set_model(model)
        _enable_compat(model)

    def on_train_begin(self, logs=None):
        devices.warn_if_keras_distribution_set()
        self._finish_left_over_fits()
        strategy = self.model.distribute_strategy
        _enable_compat(self.model)
        self._info = devices.describe_strategy(strategy)
        self._train_begin_s = self._clock()
        self._fit_started = False
        self._finished = False
        self._window.close()
        self._executions_since_sync = 0
        self._steps_per_execution = int(getattr(self.model, "steps_per_execution", 1) or 1)
        self._steps_per_epoch = (self.params or {}).get("steps")
        self._iterations_variable = None
        self._element_spec = None
        self._iterator = None
        self._adapter_batch_size = _keras_internals.batch_size_of_running_fit(sys._getframe(1))
        self._attach_guard()
        atexit.register(self._finish_at_exit)

    def on_epoch_begin(self, epoch, logs=None):
        self._window.close()
        self._epoch_samples = 0
        self._epoch_duration_s = 0.0

    def on_test_begin(self, logs=None):
        self._window.close()

    def on_train_batch_end(self, batch, logs=None):
        if self._finished:
            return
        if not self._window.is_open:
            try:
                self._open_window()
            except _GlobalBatchSizeUnknown as error:
                # Training goes on; only the figures that need it are lost.
                logger.warning("%s ThroughputLogger measures nothing in this fit.", error)
                self._finish()
                return
            except BaseException:
                self._finish()
                raise
            return
        self._executions_since_sync += 1
        steps_since_sync = self._executions_since_sync * self._steps_per_execution
        due = self.update_freq if self._window.is_measuring else self.warmup_steps
        end_of_epoch = self._steps_per_epoch is not None and batch + 1 >= self._steps_per_epoch
        if steps_since_sync >= due or end_of_epoch:
            self._measure()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and getattr(self, "_epoch_duration_s", 0.0) > 0:
            logs["samples_per_sec"] = self._epoch_samples / self._epoch_duration_s
        self._advise()
        self._save()

    def on_train_end(self, logs=None):
        self._finish()

    # Measuring.

    def _read_iterations(self):
        """The optimizer's step counter; reading it waits for the devices."""
        if self._iterations_variable is None:
            variable = self.model.optimizer.iterations
            variable = getattr(variable, "value", variable)
            # One replica's copy: all copies are equal, and reading a mirrored
            # variable as a whole costs several times more.
            self._iterations_variable = (
                self.model.distribute_strategy.experimental_local_results(variable)[0]
            )
        return int(self._iterations_variable.numpy())

    def _samples(self, iterations):
        return iterations * self._setup["global_batch_size"]

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
            self._tracing_count = self._read_tracing_count()
            now_s = self._clock()
        self._window.restart(
            time_s=now_s,
            iterations=iterations,
            samples=self._samples(iterations),
            warmup_steps=warmup_steps,
        )
        self._executions_since_sync = 0

    def _read_tracing_count(self):
        if self.model.run_eagerly or self._guard_original is None:
            return 0  # nothing is traced
        return _keras_internals.tracing_count(self._guard_original)

    def _measure(self):
        iterations = self._read_iterations()
        now_s = self._clock()
        self._executions_since_sync = 0
        tracing_count = self._read_tracing_count()
        if tracing_count != self._tracing_count:
            # The step function was traced again within this interval.
            self._tracing_count = tracing_count
            self._window.restart(
                time_s=now_s, iterations=iterations, samples=self._samples(iterations)
            )
            return
        interval = self._window.update(
            time_s=now_s, iterations=iterations, samples=self._samples(iterations)
        )
        if interval is None:
            return
        self._stats.add(interval)
        self._epoch_samples += interval.samples
        self._epoch_duration_s += interval.duration_s
        scalars = {
            "throughput/samples_per_sec": interval.samples_per_sec,
            "throughput/steps_per_sec": interval.steps_per_sec,
            "throughput/samples_per_sec_per_replica": (
                interval.samples_per_sec / self._setup["num_replicas"]
            ),
        }
        figures = self._scaling(interval.samples_per_sec)
        if figures is not None:
            scalars["scaling/speedup"] = figures.speedup
            scalars["scaling/efficiency"] = figures.efficiency
            scalars["scaling/ideal_speedup"] = figures.ideal_speedup
        scalars.update(self._utilization_scalars(interval.samples_per_sec))
        self._write(scalars, interval.end_iterations)
        if len(self._stats) == _ADVICE_AFTER_INTERVALS:
            self._advise()

    def _scaling(self, samples_per_sec):
        """`Scaling` of a throughput figure, or None without a baseline."""
        baseline = self._baseline
        if baseline is None:
            return None
        if baseline.mode == "self":
            return scaling(samples_per_sec, samples_per_sec, 1)
        if baseline.samples_per_sec is None:
            return None
        return scaling(
            samples_per_sec,
            baseline.samples_per_sec,
            self._setup["num_replicas"],
            baseline.num_replicas,
        )

    # Set-up: batch sizes, baseline, summary.

    def _set_up(self, iterations):
        info = self._info
        global_batch_size = self._resolve_global_batch_size()
        if global_batch_size % info.num_replicas:
            raise ValueError(
                f"global_batch_size={global_batch_size} is not divisible by the "
                f"{info.num_replicas} replicas; pass the samples of one optimizer "
                "step over all replicas"
            )
        policy = getattr(self.model, "dtype_policy", None)
        self._setup = {
            "strategy": info.kind,
            "num_workers": info.num_workers,
            "num_replicas": info.num_replicas,
            "device_kind": info.device_kind,
            "per_replica_batch_size": global_batch_size // info.num_replicas,
            "global_batch_size": global_batch_size,
            "dtype_policy": getattr(policy, "name", str(policy)),
        }
        self._resolve_baseline()
        self._flops = self._resolve_flops()
        if info.is_chief:
            _tensorboard.write_custom_scalars_layout(self.log_dir, _layout())
            _tensorboard.write_text(
                self.log_dir, iterations, "throughput/setup", self._setup_markdown()
            )

    def _resolve_global_batch_size(self):
        per_replica = _static_batch_size(self._element_spec)
        replicas = self._info.num_replicas
        if self.global_batch_size is not None:
            if per_replica is not None and per_replica * replicas != self.global_batch_size:
                logger.warning(
                    "ThroughputLogger: global_batch_size=%d, but the data's batches "
                    "hold %d samples per replica x %d replicas = %d",
                    self.global_batch_size, per_replica, replicas, per_replica * replicas,
                )
            return self.global_batch_size
        planned = _planned_global_batch_size(self._iterator)
        if planned is not None:
            return planned
        if per_replica is not None:
            return per_replica * replicas
        if self._adapter_batch_size is not None:
            return self._adapter_batch_size
        raise _GlobalBatchSizeUnknown(
            "ThroughputLogger cannot tell the global batch size: the training "
            f"data's batch dimension is not static (element_spec: "
            f"{self._element_spec}). Pass global_batch_size=<samples per step "
            "over all replicas>, or batch with drop_remainder=True (as "
            "keras_scaling.data.distribute does)."
        )

    def _resolve_baseline(self):
        baseline = self._baseline
        if baseline is None:
            return
        setup = self._setup
        if baseline.mode == "file":
            differences = baseline_lib.setup_differences(
                baseline.record,
                per_replica_batch_size=setup["per_replica_batch_size"],
                dtype_policy=setup["dtype_policy"],
                device_kind=setup["device_kind"],
            )
            if baseline.num_replicas != 1:
                differences.append(
                    f"the baseline ran on {baseline.num_replicas} replicas, not 1"
                )
            if differences:
                logger.warning(
                    "ThroughputLogger: the baseline %s was measured with another "
                    "set-up, so speedup compares unlike runs: %s",
                    baseline.source, "; ".join(differences),
                )
            return
        if baseline.mode == "auto" and setup["num_replicas"] == 1:
            self._baseline = baseline_lib.Baseline(
                mode="self", source="this run (one replica is its own baseline)"
            )
            return
        if baseline.mode not in ("auto", "measure") or not self._info.is_chief:
            return
        device = self._info.local_devices[0]
        try:
            samples_per_sec = baseline_lib.measure_samples_per_sec(
                self.model,
                _one_replica_spec(self._element_spec, setup["per_replica_batch_size"]),
                device,
            )
        except ValueError as error:
            if baseline.mode == "measure":
                raise
            logger.warning(
                "ThroughputLogger: no baseline, so no scaling/ tags: %s", error
            )
            self._baseline = None
            return
        self._baseline = baseline.with_value(
            samples_per_sec, f"measured: a copy of the model alone on {device}"
        )

    def _setup_markdown(self):
        setup = self._setup
        baseline = self._baseline
        if baseline is None:
            baseline_text = "none (no scaling/ tags)"
        elif baseline.mode == "self":
            baseline_text = baseline.source
        else:
            baseline_text = f"{baseline.samples_per_sec:.1f} samples/sec ({baseline.source})"
        rows = [
            ("strategy", setup["strategy"]),
            ("workers", setup["num_workers"]),
            ("replicas", setup["num_replicas"]),
            ("device kind", setup["device_kind"]),
            ("per-replica batch", setup["per_replica_batch_size"]),
            ("global batch", setup["global_batch_size"]),
            ("dtype policy", setup["dtype_policy"]),
            ("steps per execution", self._steps_per_execution),
            ("baseline", baseline_text),
            *self._flops_rows(),
            ("warm-up", f"first execution of each fit + {self.warmup_steps} steps"),
        ]
        lines = ["| | |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in rows]
        return "\n".join(lines)

    # Writing.

    def _write(self, scalars, step):
        """Writes scalars at `step` unless that step was written before."""
        if not self._info.is_chief:
            return
        if self._last_written_step is None:
            _tensorboard.flush(self.log_dir)
            self._last_written_step = _tensorboard.last_step_written(
                self.log_dir, _SCALAR_TAGS
            )
        if step <= self._last_written_step:
            return
        _tensorboard.write_scalars_fast(self.log_dir, step, scalars)
        self._last_written_step = step

    def _record(self):
        setup = self._setup
        steady = self._stats.steady_state()
        baseline = self._baseline
        record = dict.fromkeys(baseline_lib.FIELDS)
        record.update(
            version=baseline_lib.VERSION,
            step_time_s={"p10": None, "p50": None, "p90": None},
            num_replicas=setup["num_replicas"],
            num_workers=setup["num_workers"],
            per_replica_batch_size=setup["per_replica_batch_size"],
            global_batch_size=setup["global_batch_size"],
            device_kind=setup["device_kind"],
            dtype_policy=setup["dtype_policy"],
            strategy=setup["strategy"],
            steps_measured=0,
            startup_time_s=self._startup_time_s,
        )
        if baseline is not None:
            record["baseline_source"] = baseline.source
            record["baseline_samples_per_sec"] = baseline.samples_per_sec
        record.update(self._flops_fields(steady))
        if steady is None:
            return record
        record.update(
            samples_per_sec=steady.samples_per_sec,
            steps_per_sec=steady.steps_per_sec,
            step_time_s={
                "p10": steady.step_time_p10_s,
                "p50": steady.step_time_p50_s,
                "p90": steady.step_time_p90_s,
            },
            steps_measured=steady.steps_measured,
        )
        if baseline is not None and baseline.mode == "self":
            record["baseline_samples_per_sec"] = steady.samples_per_sec
        figures = self._scaling(steady.samples_per_sec)
        if figures is not None:
            record["speedup"] = figures.speedup
            record["efficiency"] = figures.efficiency
        return record

    def _save(self):
        """Writes throughput.json and flushes the event files (chief only)."""
        if self._setup is None or not self._info.is_chief:
            return
        baseline_lib.write_throughput_json(self.log_dir, self._record())
        _tensorboard.flush(self.log_dir)

    def _finish(self):
        if self._finished:
            return
        self._finished = True
        self._detach_guard()
        atexit.unregister(self._finish_at_exit)
        self._save()
        if self._setup is not None and not self._stats and self._info.is_chief:
            logger.warning(
                "ThroughputLogger: no step was measured (warm-up: first execution "
                "+ %d steps, then %d steps per figure); %s has no throughput. "
                "Train for more steps, or lower warmup_steps or update_freq.",
                self.warmup_steps, self.update_freq,
                baseline_lib.THROUGHPUT_JSON,
            )
        self._iterator = None

    def _finish_at_exit(self):
        try:
            self._finish()
        except Exception:
            logger.exception("ThroughputLogger: could not save at exit")

    # Keras does not call on_train_end when fit raises (it has no
    # try/finally), so a wrapper around the train function saves what was
    # measured when a step raises, Ctrl-C included; atexit covers the rest.

    def _finish_left_over_fits(self):
        """Saves for loggers whose fit raised outside a step, now it is over.

        A fit of this model is starting, so any guard still wrapping its train
        function belongs to a fit that ended by an exception, unless it is
        another logger of this same fit (its callbacks share `params`).
        """
        while True:
            top = self.model.train_function
            owner = getattr(top, "_keras_scaling_logger", None)
            if owner is None or (owner is not self and owner.params is self.params):
                return
            owner._finish()
            if self.model.train_function is top:
                return

    def _attach_guard(self):
        original = self.model.train_function
        self._guard_original = original
        if original is None:
            return

        def guarded_train_function(iterator):
            if self._element_spec is None and not self._finished:
                self._element_spec = getattr(iterator, "element_spec", None)
                self._iterator = iterator
            try:
                return original(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                raise  # the end of the data, not a failure
            except BaseException:
                self._finish()
                raise

        guarded_train_function._keras_scaling_logger = self
        self._guard = guarded_train_function
        self.model.train_function = guarded_train_function

    def _detach_guard(self):
        if self._guard is not None and self.model.train_function is self._guard:
            self.model.train_function = self._guard_original
        self._guard = None

    # Advice.

    def _advise(self):
        if (
            len(self._stats) < _ADVICE_AFTER_INTERVALS
            or not self._info.is_chief
            or self._advised >= {"short_steps", "low_efficiency", "underused"}
        ):
            return
        steady = self._stats.steady_state()
        step_time_s = steady.step_time_p50_s
        if (
            "short_steps" not in self._advised
            and self._steps_per_execution == 1
            and step_time_s < _SHORT_STEP_S
        ):
            self._advised.add("short_steps")
            suggested = max(2, math.ceil(0.02 / step_time_s))
            logger.warning(
                "ThroughputLogger: steps take %.2f ms, so the training loop's fixed "
                "cost per call is a large share of each step. Run several steps "
                "per call: model.compile(..., steps_per_execution=%d).",
                step_time_s * 1e3, suggested,
            )
        figures = self._scaling(steady.samples_per_sec)
        if (
            "low_efficiency" not in self._advised
            and figures is not None
            and self._setup["num_replicas"] > 1
            and figures.efficiency < _LOW_EFFICIENCY
        ):
            self._advised.add("low_efficiency")
            diagnosis = self._efficiency_diagnosis(steady.samples_per_sec)
            if self._setup["device_kind"] == "CPU" and self._info.replicas_per_worker > 1:
                diagnosis += (
                    " The replicas are CPU devices of one host, which share its "
                    "cores: they speed up only as far as free cores allow."
                )
            logger.warning(
                "ThroughputLogger: scaling efficiency is %.2f (speedup %.2f of an "
                "ideal %.2f). %s",
                figures.efficiency, figures.speedup, figures.ideal_speedup, diagnosis,
            )
        if "underused" not in self._advised and figures is not None:
            advice = self._underuse_advice(steady.samples_per_sec, figures.efficiency)
            if advice is not None:
                self._advised.add("underused")
                logger.warning("ThroughputLogger: %s", advice)

    # Model FLOPs and MFU: counted and looked up once, in _set_up, by
    # keras_scaling.flops and keras_scaling.peak_flops; the arithmetic is
    # keras_scaling.utilization's.

    def _resolve_flops(self):
        from keras_scaling import flops as flops_lib
        from keras_scaling import peak_flops as peak_lib

        resolved = dict(flops_per_sample=None, flops_source=None,
                        peak_flops_per_replica=None, peak_source=None,
                        faster_dtypes=[])
        if not self._info.is_chief:
            return resolved
        if self.flops_per_sample is None:
            resolved["flops_source"] = "off (flops_per_sample=None)"
        elif self.flops_per_sample != "auto":
            resolved.update(flops_per_sample=self.flops_per_sample, flops_source="given")
        else:
            sample = _one_replica_spec(self._element_spec, self._setup["per_replica_batch_size"])
            try:
                counted, reason = flops_lib.count_training_flops(
                    self.model, sample=_training_sample(sample)
                )
            except Exception as error:  # counting must never stop training
                counted, reason = None, f"{type(error).__name__}: {error}"
            if counted is None:
                logger.warning("ThroughputLogger: no model FLOPs, so no tflops or mfu "
                               "tags: %s", reason)
                resolved["flops_source"] = f"not counted: {reason}"
            else:
                resolved.update(flops_per_sample=counted, flops_source="counted")
        if self.peak_flops is None or resolved["flops_per_sample"] is None:
            return resolved
        policy = getattr(self.model, "dtype_policy", None)
        compute_dtype = str(getattr(policy, "compute_dtype", "float32"))
        try:
            peak, reason = peak_lib.resolve(
                self.peak_flops,
                device_kind=self._setup["device_kind"],
                device=self._info.local_devices[0],
                compute_dtype=compute_dtype,
            )
        except Exception as error:  # a failed lookup must never stop training
            peak, reason = None, f"{type(error).__name__}: {error}"
        if peak is None:
            if reason not in _PEAK_REASONS_LOGGED:
                _PEAK_REASONS_LOGGED.add(reason)
                logger.warning("ThroughputLogger: no throughput/mfu: %s", reason)
            resolved["peak_source"] = f"unknown: {reason}"
            return resolved
        resolved.update(peak_flops_per_replica=peak.flops_per_sec, peak_source=peak.source)
        resolved["faster_dtypes"] = peak_lib.faster_dtypes(peak)
        return resolved

    def _utilization(self, samples_per_sec):
        flops = self._flops
        if flops is None or flops["flops_per_sample"] is None:
            return None
        return utilization_lib.utilization(
            flops["flops_per_sample"], samples_per_sec, self._setup["num_replicas"],
            flops["peak_flops_per_replica"],
        )

    def _utilization_scalars(self, samples_per_sec):
        figures = self._utilization(samples_per_sec)
        if figures is None:
            return {}
        scalars = {
            "throughput/tflops_per_sec": figures.tflops_per_sec,
            "throughput/tflops_per_sec_per_replica": figures.tflops_per_sec_per_replica,
        }
        if figures.mfu is not None:
            scalars["throughput/mfu"] = figures.mfu
        return scalars

    def _flops_fields(self, steady):
        flops = self._flops or {}
        fields = {key: flops.get(key) for key in (
            "flops_per_sample", "flops_source", "peak_flops_per_replica", "peak_source")}
        figures = self._utilization(steady.samples_per_sec) if steady else None
        fields["mfu"] = figures.mfu if figures is not None else None
        return fields

    def _flops_rows(self):
        flops = self._flops or {}
        if flops.get("flops_per_sample") is not None:
            flops_text = f"{flops['flops_per_sample'] / 1e6:.2f} M ({flops['flops_source']})"
        else:
            flops_text = flops.get("flops_source") or "none"
        if flops.get("peak_flops_per_replica") is not None:
            peak_text = (f"{flops['peak_flops_per_replica'] / 1e12:.2f} TFLOP/s per "
                         f"replica ({flops['peak_source']})")
        else:
            peak_text = flops.get("peak_source") or "none (no mfu)"
        return [("model FLOPs per sample", flops_text), ("peak FLOPs", peak_text)]

    def _underuse_advice(self, samples_per_sec, efficiency):
        figures = self._utilization(samples_per_sec)
        if figures is None or figures.mfu is None:
            return None
        policy = getattr(self.model, "dtype_policy", None)
        arguments = dict(
            efficiency=efficiency,
            mfu=figures.mfu,
            per_replica_batch_size=self._setup["per_replica_batch_size"],
            compute_dtype=str(getattr(policy, "compute_dtype", "float32")),
            faster_dtypes=self._flops["faster_dtypes"],
        )
        if utilization_lib.underuse_advice(**arguments) is None:
            return None
        input_samples_per_sec, _ = _time_input_pipeline(self._iterator)
        if input_samples_per_sec is not None:
            input_samples_per_sec *= self._setup["num_workers"]
        return utilization_lib.underuse_advice(
            **arguments,
            input_samples_per_sec=input_samples_per_sec,
            samples_per_sec=samples_per_sec,
        )

    def _efficiency_diagnosis(self, samples_per_sec):
        input_samples_per_sec, reason = _time_input_pipeline(self._iterator)
        if input_samples_per_sec is None:
            return (
                f"The input pipeline could not be timed alone ({reason}); time "
                "`for batch in dataset.take(50)` yourself: if it yields fewer "
                f"than about {samples_per_sec:.0f} samples/sec, the input is the "
                "bottleneck, otherwise combining the updates across replicas is."
            )
        input_samples_per_sec *= self._setup["num_workers"]
        if input_samples_per_sec < 1.2 * samples_per_sec:
            return (
                f"The input pipeline alone yields {input_samples_per_sec:.0f} "
                f"samples/sec, barely more than training takes "
                f"({samples_per_sec:.0f}): the input is the likelier cause "
                "(more parallel reads and maps, prefetch, cache)."
            )
        return (
            f"The input pipeline alone yields {input_samples_per_sec:.0f} "
            f"samples/sec, well above the {samples_per_sec:.0f} training takes: "
            "combining the updates across replicas is the likelier cause "
            "(a larger per-replica batch spreads its cost over more samples)."
        )


class _GlobalBatchSizeUnknown(ValueError):
    """The samples of a step cannot be counted, so throughput is unknown."""


def _positive_int(value, parameter):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{parameter} must be a positive int, got {value!r}")
    if value < 1:
        raise ValueError(f"{parameter} must be at least 1, got {value}")
    return value


def _enable_compat(model):
    from keras_scaling import compat

    compat.enable_for(model.distribute_strategy)


def _one_replica_spec(element_spec, per_replica_batch_size):
    """One replica's batch spec, its batch dimension set to the known size."""

    def one(spec):
        # A PerReplicaSpec holds one spec per local replica.
        spec = _tf_data_internals.first_replica_spec(spec)
        if isinstance(spec, tf.TensorSpec) and spec.shape.rank:
            shape = [per_replica_batch_size] + spec.shape.as_list()[1:]
            return tf.TensorSpec(shape, spec.dtype, spec.name)
        return spec

    return tf.nest.map_structure(one, element_spec)


def _training_sample(spec):
    """`(x, y, sample_weight)` of a one-replica spec, for counting FLOPs."""
    if isinstance(spec, dict) or not isinstance(spec, (tuple, list)):
        return spec
    return tuple(spec)


def _static_batch_size(element_spec):
    """One replica's static batch size from an input spec, or None."""
    if element_spec is None:
        return None
    sizes = set()
    for spec in tf.nest.flatten(element_spec, expand_composites=True):
        shape = getattr(spec, "shape", None)
        if shape is not None and shape.rank:
            sizes.add(shape[0])
    if len(sizes) != 1:
        return None
    (size,) = sizes
    return size


def _planned_global_batch_size(iterator):
    """The global batch of the `keras_scaling.data` plan behind an iterator, or None.

    `fit` distributes the dataset it is given; the datasets TensorFlow derives
    from it keep it as an input, so the plan is found up that chain.
    """
    from keras_scaling import data

    pending = [_tf_data_internals.dataset_of_iterator(iterator)]
    seen = set()
    while pending:
        dataset = pending.pop()
        if not isinstance(dataset, tf.data.Dataset) or id(dataset) in seen:
            continue
        seen.add(id(dataset))
        plan = data.plan_of(dataset)
        if plan is not None:
            return plan.global_batch_size
        pending.extend(_tf_data_internals.dataset_inputs(dataset))
    return None




def _layout():
    from tensorboard.plugins.custom_scalar import layout_pb2

    def chart(title, *tags):
        return layout_pb2.Chart(
            title=title,
            multiline=layout_pb2.MultilineChartContent(
                tag=[f"^{tag}$" for tag in tags]
            ),
        )

    return layout_pb2.Layout(
        category=[
            layout_pb2.Category(
                title="scaling",
                chart=[
                    chart("speedup vs ideal", "scaling/speedup", "scaling/ideal_speedup"),
                    chart("efficiency", "scaling/efficiency"),
                    chart("samples/sec", "throughput/samples_per_sec"),
                    chart("model TFLOP/s", "throughput/tflops_per_sec"),
                    chart("MFU", "throughput/mfu"),
                ],
            )
        ]
    )


def _time_input_pipeline(iterator):
    """This worker's input samples/sec, read alone, or (None, why not)."""
    dataset = _tf_data_internals.dataset_of_iterator(iterator)
    if dataset is None:
        return None, "its dataset is out of reach"
    ops = _tf_data_internals.op_types(dataset)
    if ops is None:
        return None, "its graph cannot be inspected"
    if ops & _PYTHON_OPS:
        return None, "it runs Python code, which may not be safe to read twice"
    batches = iter(dataset)
    next(batches)
    samples = 0
    start_s = time.perf_counter()
    for _ in range(_INPUT_PROBE_BATCHES):
        try:
            batch = next(batches)
        except StopIteration:
            break
        samples += int(tf.nest.flatten(batch)[0].shape[0])
    elapsed_s = time.perf_counter() - start_s
    if samples == 0 or elapsed_s <= 0:
        return None, "it yielded too few batches"
    return samples / elapsed_s, None
