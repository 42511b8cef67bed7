"""`ReplicaSyncCheck`: checks that the mirrored copies of every weight stay equal.

A thin adapter from Keras' training hooks onto `keras_scaling.replica_state`:
it decides when to compare (from the optimizer's step counter), asks a
`ReplicaStateChecker` for a report, and acts on it (raise, warn, resync,
TensorBoard scalars).
"""

import logging
import os
import weakref
from typing import Any

import keras
import tensorflow as tf

from keras_scaling import _validation, compat, devices
from keras_scaling.devices import _topology
from keras_scaling.fit_hooks import _step_counter, _train_function_hook
from keras_scaling.replica_sync import _schedule, _tracked_variables, replica_state
from keras_scaling.summaries import _tensorboard

__all__ = ["ReplicaDivergenceError", "ReplicaSyncCheck"]

logger = logging.getLogger("keras_scaling")

ON_DIVERGENCE_MODES = ("raise", "warn", "resync")
_SCALAR_TAGS = frozenset({"replica_sync/max_abs_diff", "replica_sync/diverged_variables"})
# The checker of each model, shared by the callbacks that check it with the
# same settings, so that its compiled function is traced once per model rather
# than once per callback (a new callback in each `fit` would pay it at each
# start). Keyed weakly: a checker holds the variables and the strategy, not
# the model.
_checkers_by_model: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class ReplicaDivergenceError(RuntimeError):
    """Raised by `ReplicaSyncCheck(on_divergence="raise")` when copies diverge.

    The message is the readable report; `.report` holds the
    `keras_scaling.replica_state.ReplicaSyncReport` itself (step, and per
    diverged variable its path, shape, dtype, aggregation, synchronization,
    differing replicas and devices, differences and likely cause).

    Args:
        report: the `keras_scaling.replica_state.ReplicaSyncReport` whose
            divergences are raised; its `str` is the message.

    Example:

    ```python
    import keras
    import numpy as np
    import keras_scaling

    keras_scaling.use_logical_cpus(2)
    strategy = keras_scaling.auto_strategy()
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(1, name="dense")], name="sequential"
        )
        model.compile(optimizer="sgd", loss="mse")
    bias_copies = strategy.experimental_local_results(model.layers[0].bias.value)
    # As if the last replica had its own update:
    bias_copies[-1].assign([0.5])
    x = np.ones((32, 4), "float32")
    try:
        model.fit(x, x[:, :1], callbacks=[keras_scaling.ReplicaSyncCheck()], verbose=0)
    except keras_scaling.ReplicaDivergenceError as error:
        print([v.path for v in error.report.divergences])   # ['sequential/dense/bias']
    ```
    """

    def __init__(self, report: "replica_state.ReplicaSyncReport") -> None:
        super().__init__(str(report))
        self.report = report


class ReplicaSyncCheck(keras.callbacks.Callback):
    """Checks that every replica holds bitwise-equal copies of every weight.

    In synchronous data parallelism every replica applies the same combined
    update, so the copies of each variable must stay identical; when they do
    not, training silently degrades and the saved model holds replica 0's
    copy only. This callback compares the copies of every distributed
    variable of the model (trainable, non-trainable, seed generator state)
    and, with `include_optimizer`, of the optimizer (slots, learning rate,
    iteration counter), across all replicas of all workers:

    - at the start of training, every `every_n_steps` optimizer steps
      (weight updates: the batches trained, read from the optimizer's step
      counter, divided by its `gradient_accumulation_steps`; so it stays
      right with `steps_per_execution > 1` and across several `fit` calls),
      and at the end of training;
    - cheaply: each replica fingerprints its own copies on its device in one
      compiled function: 64 bits per copy, which always change when one
      element changes (even by one ulp) and when two elements trade places
      or change by +k and -k, bar the exceptions the replica sync guide
      lists; other differences escape only if 64 bits collide. Only the
      small table of fingerprints crosses
      to the host, and only variables whose fingerprints differ are
      gathered in full to measure how they differ. The compiled function is
      traced at a model's first check and shared by every `ReplicaSyncCheck`
      of that model with the same settings, so a new callback in each `fit`
      does not trace it again.

    Under `MultiWorkerMirroredStrategy` the fingerprint table is gathered
    across workers, so every worker reaches the same verdict at the same
    step: a divergence on one worker stops all of them.

    Per-replica state is not divergence: variables with
    `synchronization=ON_READ`, the moving statistics of
    `keras.layers.BatchNormalization(synchronized=False)` (updated from each
    replica's own batch) and gradient accumulators. `per_replica_state`
    says what to do when their copies differ.

    A report (`keras_scaling.replica_state.ReplicaSyncReport`) names, per
    variable: path, shape, dtype, aggregation, synchronization, the replicas
    (and devices) that differ from replica 0, the maximum absolute and
    relative difference, the number of differing elements, the NaN/Inf count
    per replica and a likely cause. `check()` returns one on demand, and the
    latest is kept in `last_report`.

    With one replica (or the default strategy) there is nothing to compare:
    the callback says so once and does nothing.

    With `log_dir`, it writes the scalars `replica_sync/max_abs_diff` and
    `replica_sync/diverged_variables` beside the loss that
    `keras.callbacks.TensorBoard(log_dir)` writes, from the chief worker only.

    Args:
        every_n_steps: int, default 100. Compare every this many optimizer
            steps, at least 1.
        include_optimizer: bool, default True. Also compare the optimizer's
            variables.
        on_divergence: `"raise"` (default): stop training with
            `ReplicaDivergenceError`, which carries the report. `"warn"`: log
            the report and continue. `"resync"`: copy replica 0's value to
            every replica, log what was repaired, and continue.
        per_replica_state: `"warn"` (default): one warning naming the
            per-replica state that differs and its spread, the first time.
            `"ignore"`: do not compare it. `"error"`: treat it as divergence.
            `"average"`: replace every copy by the mean across replicas at
            each check, so every replica and the saved model hold the same
            averaged values.
        atol: float, default 0. With `atol` or `rtol` above 0, differences
            within `atol + rtol * |copy on replica 0|` are reported as
            "float drift" (a warning) instead of divergence. Equality is
            bitwise when both are 0.
        rtol: float, default 0. See `atol`.
        log_dir: path or None, default None. Where to write TensorBoard
            scalars, as for `keras.callbacks.TensorBoard(log_dir)`.

    Example:

    ```python
    import tempfile

    import keras
    import numpy as np
    import keras_scaling

    keras_scaling.use_logical_cpus(2)
    strategy = keras_scaling.auto_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    check = keras_scaling.ReplicaSyncCheck(every_n_steps=4, log_dir=tempfile.mkdtemp())
    model.fit(x, y, batch_size=32, epochs=2, callbacks=[check], verbose=0)
    # Compare now, and read the report:
    print(check.check())   # Replica sync check at step 16: ... 0 diverged, ...
    ```
    """

    def __init__(
        self,
        every_n_steps: int = 100,
        *,
        include_optimizer: bool = True,
        on_divergence: str = "raise",
        per_replica_state: str = "warn",
        atol: float = 0.0,
        rtol: float = 0.0,
        log_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        self.every_n_steps = _validation.positive_int(every_n_steps, "every_n_steps")
        self.include_optimizer = bool(include_optimizer)
        self.on_divergence = _validation.one_of(on_divergence, "on_divergence", ON_DIVERGENCE_MODES)
        self.per_replica_state = _validation.one_of(
            per_replica_state, "per_replica_state", replica_state.PER_REPLICA_STATE_MODES
        )
        bitwise = "0 means bitwise equality"
        self.atol = _validation.non_negative_number(atol, "atol", fix=bitwise)
        self.rtol = _validation.non_negative_number(rtol, "rtol", fix=bitwise)
        self.log_dir = None if log_dir is None else _tensorboard.check_log_dir(log_dir)
        self.last_report: replica_state.ReplicaSyncReport | None = None
        self._checker: Any = None  # set when the first fit starts
        self._checker_key: tuple | None = None
        self._checker_optimizer = None
        self._last_checked_step = None
        self._step_upper_bound = 0
        self._num_replicas: int | None = None
        self._step_counter: _step_counter.BatchCounter | None = None
        self._last_written_step = None
        self._said_single_replica = False
        self._warned_per_replica_state = False
        self._hook: _train_function_hook.TrainFunctionHook | None = None
        self._execution_steps = 1
        self._holds_log_dir = False

    # Hooks.

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._num_replicas = None
        self._step_counter = None
        compat._enable_for_quietly(self._strategy())

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        devices.warn_if_keras_distribution_set()
        _train_function_hook.abandon_other_fits(self.model, self.params)
        compat._enable_for_quietly(self._strategy())
        self._hold_log_dir()
        self._check_and_act()
        if not self._single_replica():
            # Read once: reading a model's attribute costs microseconds, and
            # the hook runs at every call.
            self._execution_steps = self._steps_per_execution()
            self._hook = _train_function_hook.TrainFunctionHook(
                self.model,
                after=self._after_execution,
                owner=self.params,
                on_error=self._release_log_dir,
                on_abandoned=self._detach,
            )
            self._hook.attach()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._hook is not None:
            self._execution_steps = self._steps_per_execution()
            self._hook.attach()  # again, in case the train function was rebuilt

    def _after_execution(self):
        """Runs after each call of the train function (there is no batch hook).

        A batch hook would make Keras wait for every step to finish before
        dispatching the next (see `keras_scaling.fit_hooks._train_function_hook`).
        """
        last = self._last_checked_step
        if last is not None:
            # One call covers at most `steps_per_execution` batches, each at
            # most one optimizer step (fewer with gradient accumulation): the
            # counter is read (tens of microseconds) only once this upper
            # bound reaches the next multiple.
            self._step_upper_bound += self._execution_steps
            if not _schedule.check_is_due(self._step_upper_bound, last, self.every_n_steps):
                return
        step = self._current_step()
        self._step_upper_bound = step
        if _schedule.check_is_due(step, last, self.every_n_steps):
            self._check_and_act(find_variables=False)

    def _steps_per_execution(self):
        return max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._detach_hook()
        try:
            if not self._single_replica() and self._current_step() != self._last_checked_step:
                self._check_and_act(find_variables=False)
        finally:
            self._release_log_dir()

    def _detach(self):
        """Ends this callback's part in a fit: on abandonment, and before a divergence is raised."""
        self._detach_hook()
        self._release_log_dir()

    def _detach_hook(self):
        if self._hook is not None:
            self._hook.detach()
            self._hook = None

    def _hold_log_dir(self):
        """Holds the event file open for this fit; `_release_log_dir` closes it at its end.

        The scalars go into the one event file of `log_dir/scaling` that
        `ThroughputLogger` writes too, through the same writer and lock.
        """
        if self.log_dir is None or self._holds_log_dir:
            return
        if self.model is not None and not _topology.is_chief(self._strategy()):
            return
        _tensorboard.hold(self.log_dir)
        self._holds_log_dir = True

    def _release_log_dir(self):
        if self._holds_log_dir:
            self._holds_log_dir = False
            _tensorboard.release(self.log_dir)

    # Public API.

    def check(self) -> "replica_state.ReplicaSyncReport":
        """Compares every replica's copies now and returns the report.

        It neither raises nor resyncs (the training hooks do that according
        to `on_divergence`); with `per_replica_state="average"` it does
        average per-replica state that differs. Under several workers every
        worker must call it at the same point: it is a collective operation.

        Returns:
            A `keras_scaling.replica_state.ReplicaSyncReport`; `report.ok` is
            true when no variable diverged.

        Raises:
            ValueError: the callback has no model yet.
        """
        return self._compare(find_variables=True)

    # Internals.

    def _compare(self, find_variables):
        if self.model is None:
            raise ValueError(
                "ReplicaSyncCheck.check() needs a model: pass the callback to "
                "model.fit, or call set_model(model) first"
            )
        step = self._current_step()
        strategy = self._strategy()
        if self._single_replica():
            report = replica_state.ReplicaSyncReport(
                step=step,
                num_replicas=_topology.num_replicas(strategy),
                num_workers=_topology.num_workers(strategy),
                num_variables=0,
            )
        else:
            report = self._get_checker(strategy, find_variables).check(step)
        self._last_checked_step = self._step_upper_bound = step
        self.last_report = report
        return report

    def _strategy(self):
        strategy = getattr(self.model, "distribute_strategy", None)
        return strategy or tf.distribute.get_strategy()

    def _single_replica(self):
        if self.model is None:
            return False
        if self._num_replicas is None:
            self._num_replicas = _topology.num_replicas(self._strategy())
        if self._num_replicas > 1:
            return False
        if not self._said_single_replica:
            logger.warning(
                "ReplicaSyncCheck: the model runs on one replica, so there are "
                "no copies to compare; the check does nothing"
            )
            self._said_single_replica = True
        return True

    def _optimizer(self):
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None or not getattr(optimizer, "built", False):
            return None
        return optimizer

    def _current_step(self):
        """The optimizer steps (weight updates) so far: `every_n_steps` counts them."""
        optimizer = self._optimizer()
        if optimizer is None:
            return 0
        if self._step_counter is None:
            self._step_counter = _step_counter.BatchCounter(self.model)
        batches = self._step_counter.read()
        if batches is None:
            # The probe of the step counter has said what is lost: without a
            # step, the check runs at the start of each fit only.
            return 0
        return _step_counter.weight_updates(batches, _step_counter.accumulation_steps(optimizer))

    def _get_checker(self, strategy, find_variables):
        optimizer = self._optimizer() if self.include_optimizer else None
        same_optimizer = optimizer is self._checker_optimizer
        if not find_variables and self._checker is not None and same_optimizer:
            # Inside `fit` the variables are those found at its start:
            # listing them again walks every layer at every check.
            return self._checker
        variables = replica_state.tracked_variables(self.model, optimizer)
        # The checker holds the variables and the strategy, so their ids stay
        # theirs while it is kept.
        key = (
            tuple(id(v.variable) for v in variables),
            id(strategy),
            self.atol,
            self.rtol,
            self.per_replica_state,
        )
        self._checker_optimizer = optimizer
        if key != self._checker_key:
            shared_key, checker = _checkers_by_model.get(self.model, (None, None))
            if shared_key != key:
                checker = replica_state.ReplicaStateChecker(
                    strategy,
                    variables,
                    atol=self.atol,
                    rtol=self.rtol,
                    per_replica_state=self.per_replica_state,
                )
                _checkers_by_model[self.model] = (key, checker)
            self._checker = checker
            self._checker_key = key
            single = _tracked_variables.single_copy_paths(self.model, optimizer)
            if single:
                logger.warning(
                    "ReplicaSyncCheck: %d variable(s) have a single copy, not one "
                    "per replica, and are not compared (created outside "
                    "strategy.scope()?): %s",
                    len(single),
                    ", ".join(single[:10]) + (", ..." if len(single) > 10 else ""),
                )
        return self._checker

    def _check_and_act(self, find_variables=True):
        if self._single_replica():
            return
        report = self._compare(find_variables)
        self._write_scalars(report)
        self._warn_about_per_replica_state(report)
        if report.float_drift:
            logger.warning(
                "ReplicaSyncCheck at step %d: float drift within atol=%g, rtol=%g:\n%s",
                report.step,
                self.atol,
                self.rtol,
                "\n".join(str(v) for v in report.float_drift),
            )
        if report.ok:
            return
        if self.on_divergence == "raise":
            # The fit ends here, without on_train_end.
            self._detach()
            raise ReplicaDivergenceError(report)
        if self.on_divergence == "resync":
            report = self.last_report = self._checker.resync(report)
            logger.warning(
                "ReplicaSyncCheck: copies diverged; resynced %d variable(s) "
                "from replica 0 and continuing.\n%s",
                len(report.divergences),
                report,
            )
        else:
            logger.warning("ReplicaSyncCheck: copies diverged.\n%s", report)

    def _warn_about_per_replica_state(self, report):
        if not report.per_replica_state or self._warned_per_replica_state:
            return
        if self.per_replica_state not in ("warn", "average"):
            return
        self._warned_per_replica_state = True
        spreads = ", ".join(
            f"{v.path} (max abs diff {v.difference.max_abs_diff:.3g})"
            for v in report.per_replica_state
        )
        action = (
            "averaged across replicas at every check"
            if self.per_replica_state == "average"
            else "not divergence; per_replica_state='average' makes the copies equal"
        )
        logger.warning(
            "ReplicaSyncCheck at step %d: per-replica state differs between "
            "replicas (%s): %s. Cause: %s.",
            report.step,
            action,
            spreads,
            report.per_replica_state[0].likely_cause,
        )

    def _write_scalars(self, report):
        if self.log_dir is None or not _topology.is_chief(self._strategy()):
            return
        if self._last_written_step is None:
            # A resumed run (BackupAndRestore) checks again at the step where
            # the run it resumes may have written already.
            self._last_written_step = _tensorboard.last_step_written(self.log_dir, _SCALAR_TAGS)
        if report.step <= self._last_written_step:
            return
        self._last_written_step = report.step
        _tensorboard.write_scalars(
            self.log_dir,
            report.step,
            {
                "replica_sync/max_abs_diff": report.max_abs_diff,
                "replica_sync/diverged_variables": len(report.divergences),
            },
        )
