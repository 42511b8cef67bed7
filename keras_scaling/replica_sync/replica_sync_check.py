"""`ReplicaSyncCheck`: checks that the mirrored copies of every weight stay equal."""

import logging
import os
import weakref
from typing import Any

import keras
import tensorflow as tf

from keras_scaling import _validation, compat, devices
from keras_scaling.devices import _topology
from keras_scaling.fit_hooks import _step_counter, _train_function_hook
from keras_scaling.replica_sync import _tracked_variables, replica_state
from keras_scaling.summaries import _tensorboard

__all__ = ["ReplicaDivergenceError", "ReplicaSyncCheck"]

logger = logging.getLogger("keras_scaling")

ON_DIVERGENCE_MODES = ("raise", "warn", "resync")
_SCALAR_TAGS = frozenset({"replica_sync/max_abs_diff", "replica_sync/diverged_variables"})
# Shared by a model's callbacks with the same settings, so that its function is
# traced once per model, not once per `fit` (tracing ResNet50's takes 6-9 s).
_checkers_by_model: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class ReplicaDivergenceError(RuntimeError):
    """Raised by `ReplicaSyncCheck(on_divergence="raise")` when copies diverge.

    Args:
        report: the `ReplicaSyncReport`, kept as `.report`; its `str` is the message.

    Example:

    ```python
    report = keras_scaling.replica_state.ReplicaSyncReport(8, 2, 1, num_variables=4)
    keras_scaling.ReplicaDivergenceError(report).report.step   # 8
    ```
    """

    def __init__(self, report: "replica_state.ReplicaSyncReport") -> None:
        super().__init__(str(report))
        self.report = report


class ReplicaSyncCheck(keras.callbacks.Callback):
    """Checks that every replica holds bitwise-equal copies of every weight.

    Compares the copies of the model's (and optimizers') distributed variables across all replicas
    of all workers at the start of training, every `every_n_steps` optimizer steps and at the end;
    every worker reaches the same verdict. Per-replica state (`ON_READ`, unsynchronized
    BatchNormalization statistics, gradient accumulators) is not divergence. `check()` compares
    now; the latest report is `last_report`. With one replica it says so once and does nothing.

    Args:
        every_n_steps: int, default 100. Compare every this many optimizer steps.
        include_optimizer: bool, default True. Also compare the variables of the optimizers
            the model holds: `model.optimizer`, and a GAN's `d_optimizer` and `g_optimizer`.
        on_divergence: `"raise"` (default, `ReplicaDivergenceError`), `"warn"` (log the report)
            or `"resync"` (copy replica 0's value to every replica and log it).
        per_replica_state: `"warn"` (default, once), `"ignore"`, `"error"` (as divergence) or
            `"average"` (every copy replaced by the mean at each check).
        atol: float, default 0. Differences within `atol + rtol * |copy_0|` are "float drift"
            (a warning); both 0 means bitwise equality.
        rtol: float, default 0. See `atol`.
        log_dir: path or None. Writes the `replica_sync/` scalars there (chief only).

    Example:

    ```python
    keras_scaling.use_logical_cpus(2)
    strategy = keras_scaling.auto_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    check = keras_scaling.ReplicaSyncCheck(every_n_steps=4)
    model.fit(x, x[:, :1], batch_size=32, epochs=2, callbacks=[check], verbose=0)
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
        self._checker: Any = None
        self._optimizers_seen: tuple[Any, ...] | None = None
        self._last_checked_step = None
        self._step_upper_bound = 0
        self._num_replicas: int | None = None
        self._step_counter: _step_counter.BatchCounter | None = None
        self._last_written_step = None
        self._said_single_replica = False
        self._warned_per_replica_state = False
        self._hook: _train_function_hook.TrainFunctionHook | None = None

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._num_replicas = None
        self._step_counter = None
        compat._enable_for_quietly(self._strategy())

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        devices.warn_if_keras_distribution_set()
        _train_function_hook.abandon_other_fits(self.model, self.params)
        compat._enable_for_quietly(self._strategy())
        self._check_and_act()
        if not self._single_replica():
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
            self._hook.attach()  # again, in case the train function was rebuilt

    def _after_execution(self):
        """After each call of the train function: a batch hook would make Keras wait for every step."""
        last = self._last_checked_step
        if last is not None:
            # A call trains at most steps_per_execution steps: the counter is read only past a multiple.
            self._step_upper_bound += self.model.steps_per_execution
            if not check_is_due(self._step_upper_bound, last, self.every_n_steps):
                return
        step = self._current_step()
        self._step_upper_bound = step
        if check_is_due(step, last, self.every_n_steps):
            self._check_and_act(find_variables=False)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        try:
            if not self._single_replica() and self._current_step() != self._last_checked_step:
                self._check_and_act(find_variables=False)
        finally:
            self._detach()

    def _detach(self):
        """At the end of a fit, on abandonment, and before a divergence is raised."""
        if self._hook is not None:
            self._hook.detach()
            self._hook = None
        self._release_log_dir()

    def _release_log_dir(self):
        """Closes this process's event file of `log_dir/scaling` at the end of a fit."""
        if self.log_dir is not None:
            _tensorboard.close(self.log_dir)

    def check(self) -> "replica_state.ReplicaSyncReport":
        """Compares the copies now, on every worker at once; reports a divergence, never resyncs it.

        Returns:
            A `keras_scaling.replica_state.ReplicaSyncReport`.

        Raises:
            ValueError: the callback has no model yet.
        """
        return self._compare(find_variables=True)

    def _compare(self, find_variables):
        if self.model is None:
            raise ValueError("ReplicaSyncCheck.check() needs a model: call set_model(model) first")
        step = self._current_step()
        strategy = self._strategy()
        if self._single_replica():
            counts = (_topology.num_replicas(strategy), _topology.num_workers(strategy))
            report = replica_state.ReplicaSyncReport(step, *counts, num_variables=0)
        else:
            report = self._get_checker(strategy, find_variables).check(step)
        self._last_checked_step = self._step_upper_bound = step
        self.last_report = report
        return report

    def _strategy(self):
        return getattr(self.model, "distribute_strategy", None) or tf.distribute.get_strategy()

    def _single_replica(self):
        if self.model is None:
            return False
        if self._num_replicas is None:
            self._num_replicas = _topology.num_replicas(self._strategy())
        if self._num_replicas > 1:
            return False
        if not self._said_single_replica:
            logger.warning("ReplicaSyncCheck: one replica, no copies to compare; it does nothing")
            self._said_single_replica = True
        return True

    def _optimizer(self):
        optimizer = getattr(self.model, "optimizer", None)
        return optimizer if getattr(optimizer, "built", False) else None

    def _optimizers(self):
        """The built optimizers the model holds: `model.optimizer`, a GAN's `d_optimizer` and `g_optimizer`."""
        held = _step_counter.held_optimizers(self.model).values()
        return tuple(o for o in held if getattr(o, "built", False))

    def _current_step(self):
        """The optimizer steps (weight updates) so far."""
        optimizer = self._optimizer()
        if optimizer is None:
            return 0
        if self._step_counter is None:
            self._step_counter = _step_counter.BatchCounter(self.model)
        batches = self._step_counter.read()
        if batches is None:  # its probe warned: checks at each fit's start only
            return 0
        return _step_counter.weight_updates(batches, _step_counter.accumulation_steps(optimizer))

    def _get_checker(self, strategy, find_variables):
        optimizers = self._optimizers() if self.include_optimizer else ()
        if not find_variables and self._checker is not None and optimizers == self._optimizers_seen:
            return self._checker  # listing the variables walks every layer
        self._optimizers_seen = optimizers
        variables = replica_state.tracked_variables(self.model, optimizers)
        # The checker holds the variables and the strategy: their ids stay theirs.
        settings = (self.atol, self.rtol, self.per_replica_state)
        key = (tuple(id(v.variable) for v in variables), id(strategy), settings)
        shared_key, checker = _checkers_by_model.get(self.model, (None, None))
        if shared_key != key:
            checker = replica_state.ReplicaStateChecker(strategy, variables, *settings)
            _checkers_by_model[self.model] = (key, checker)
        if checker is not self._checker:
            self._checker = checker
            single = _tracked_variables.single_copy_paths(self.model, optimizers)
            if single:
                paths = ", ".join(single[:10]) + (", ..." if len(single) > 10 else "")
                logger.warning(
                    f"ReplicaSyncCheck: {len(single)} variable(s) with a single copy are not compared (created outside strategy.scope()?): {paths}"
                )
        return checker

    def _check_and_act(self, find_variables=True):
        if self._single_replica():
            return
        report = self._compare(find_variables)
        self._write_scalars(report)
        self._warn_about_per_replica_state(report)
        if report.float_drift:
            drift = "\n".join(str(v) for v in report.float_drift)
            logger.warning(
                f"ReplicaSyncCheck at step {report.step}: float drift within atol={self.atol:g}, rtol={self.rtol:g}:\n{drift}"
            )
        if report.ok:
            return
        if self.on_divergence == "raise":
            self._detach()  # no on_train_end follows
            raise ReplicaDivergenceError(report)
        if self.on_divergence == "resync":
            report = self.last_report = self._checker.resync(report)
            resynced = len(report.divergences)
            logger.warning(
                f"ReplicaSyncCheck: copies diverged; resynced {resynced} variable(s) from replica 0.\n{report}"
            )
        else:
            logger.warning("ReplicaSyncCheck: copies diverged.\n%s", report)

    def _warn_about_per_replica_state(self, report):
        # Only "warn" and "average" report it: "ignore" leaves it out, "error" calls it divergence.
        states = report.per_replica_state
        if not states or self._warned_per_replica_state:
            return
        self._warned_per_replica_state = True
        spreads = ", ".join(
            f"{s.path} (max abs diff {s.difference.max_abs_diff:.3g})" for s in states
        )
        action = "not divergence; per_replica_state='average' makes the copies equal"
        if self.per_replica_state == "average":
            action = "averaged at every check"
        logger.warning(
            f"ReplicaSyncCheck at step {report.step}: per-replica state differs between replicas ({action}): {spreads}. Cause: {states[0].likely_cause}."
        )

    def _write_scalars(self, report):
        if self.log_dir is None or not _topology.is_chief(self._strategy()):
            return
        if self._last_written_step is None:  # a resumed run may have written this step
            self._last_written_step = _tensorboard.last_step_written(self.log_dir, _SCALAR_TAGS)
        if report.step <= self._last_written_step:
            return
        self._last_written_step = report.step
        scalars = {
            "replica_sync/max_abs_diff": report.max_abs_diff,
            "replica_sync/diverged_variables": len(report.divergences),
        }
        _tensorboard.write_scalars(self.log_dir, report.step, scalars)


def check_is_due(step: int, last_checked_step: int | None, every_n_steps: int) -> bool:
    """Due at the first look, then once a multiple of `every_n_steps` is passed."""
    return last_checked_step is None or step // every_n_steps > last_checked_step // every_n_steps
