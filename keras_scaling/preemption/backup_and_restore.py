"""`BackupAndRestore`: survive preemption, resume inside the epoch, bitwise."""

import dataclasses
import logging
import os
import shutil
import signal
import threading
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_scaling import _training_state, _validation
from keras_scaling.devices import _topology
from keras_scaling.fit_hooks import _fit_end, _step_counter, _train_function_hook
from keras_scaling.preemption import _backup, _resume

logger = logging.getLogger("keras_scaling")

__all__ = ["BackupAndRestore", "BackupError", "EXIT_PREEMPTED"]

EXIT_PREEMPTED = _backup.EXIT_PREEMPTED
BackupError = _backup.BackupError

_PREEMPTION_DIR = ".preemption"


class BackupAndRestore(keras.callbacks.Callback):
    """Saves training where it stands, and resumes there, inside the epoch.

    A drop-in for `keras.callbacks.BackupAndRestore`: the variables and the
    position go to `backup_dir/backup.npz`, atomically, at every epoch end,
    every `save_every_n_steps` steps and on SIGTERM, after which
    training stops and `fit` raises `SystemExit(75)` (`EXIT_PREEMPTED`) from
    `on_train_end` (later callbacks get none). The same script run again
    resumes at the saved step: exactly with `keras_scaling.data.distribute`
    data, else at the start of the saved epoch, as Keras does. A backup of
    another model or data plan raises `BackupError` and overwrites nothing.

    Args:
        backup_dir: str or path, where the backup lives; created when missing.
        save_every_n_steps: int or None (default), also save every this many steps (batches).
        save_on_preemption: bool, default True. Save and stop on SIGTERM.
        delete_checkpoint: bool, default True. Delete the backup when training ends normally.

    Raises:
        TypeError: `backup_dir` is not a path.
        ValueError: an argument is out of range.

    Example:

    ```python
    keras_scaling.use_logical_cpus(2)
    strategy = keras_scaling.auto_strategy()
    x = np.random.rand(1024, 8).astype("float32")
    train = keras_scaling.data.distribute((x, x), strategy=strategy, per_replica_batch_size=32)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8)])
        model.compile(optimizer="adam", loss="mse")
    # Preempted (SIGTERM)? The process exits with status 75; run it again.
    backup = keras_scaling.BackupAndRestore("backup", save_every_n_steps=100)
    model.fit(train, epochs=5, callbacks=[backup])
    ```
    """

    EXIT_PREEMPTED = EXIT_PREEMPTED

    def __init__(
        self,
        backup_dir: str | os.PathLike[str],
        *,
        save_every_n_steps: int | None = None,
        save_on_preemption: bool = True,
        delete_checkpoint: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(backup_dir, (str, os.PathLike)) or not os.fspath(backup_dir):
            raise TypeError(
                f"backup_dir must be a directory path like 'backup', got {backup_dir!r}"
            )
        self.save_every_n_steps = _validation.optional_positive_int(
            save_every_n_steps, "save_every_n_steps"
        )
        self.save_on_preemption = _validation.boolean(save_on_preemption, "save_on_preemption")
        self.delete_checkpoint = _validation.boolean(delete_checkpoint, "delete_checkpoint")
        self.backup_dir = os.fspath(backup_dir)
        self._handler = None
        self._changes: Any = None
        self._signal_received = threading.Event()
        self._previous_sigterm_handler: Any = None
        self._warned: set[str] = set()

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        # A fit of this thread that raised left its changes: it is over.
        _fit_end.end_other_fits(self.params)
        _train_function_hook.abandon_other_fits(self.model, self.params)
        self._end_fit()
        # A read-only or full backup_dir fails here, not at the first save.
        _validation.writable_directory(self.backup_dir, "backup_dir", "BackupAndRestore")
        self._batch_counter = _step_counter.BatchCounter(self.model)
        if self._batch_counter.read() is None:  # its probe warned why
            raise ValueError(
                "BackupAndRestore cannot count the batches trained with gradient_accumulation_steps"
                " on this Keras: train without it to back up"
            )
        self._changes = _fit_end.FitChanges(self.params)
        strategy = self.model.distribute_strategy
        self._is_chief = _topology.is_chief(strategy)
        self._preempted = False
        self._signal_received.clear()
        self._training_data: Any = None
        self._resume_pending: Any = None
        self._changes.add(lambda: setattr(self.model, "_initial_epoch", None))
        self._train_hook = _train_function_hook.TrainFunctionHook(
            self.model,
            after=self._after_execution,
            before=self._see_iterator,
            on_error=self._end_fit,
            owner=self.params,
            on_abandoned=self._end_fit,
        )
        self._changes.add(self._train_hook.detach)
        self._restore()
        # Batches, not optimizer steps: a LossScaleOptimizer skips the update of a step that overflows.
        self._batches = self._last_saved_batches = self._batch_counter.read()
        if self.save_on_preemption:
            self._watch_for_preemption(strategy)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._epoch_start_batches = self._batches
        self._steps_skipped = 0
        self._changes.unwatch()  # the fit is alive; Keras drops the last epoch's iterator now
        self._train_hook.before = self._see_iterator
        self._train_hook.skip = None  # only the resumed epoch skips
        self._train_hook.attach()  # again each epoch: a callback's on_train_begin may rebuild it

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._preempted:
            return
        self._batches = self._epoch_start_batches + self._trained_in_epoch()
        iterations = self._batch_counter.read()
        data_pass = None if self._training_data is None else self._training_data.next_pass
        self._save(_backup.Position(epoch + 1, 0, iterations, data_pass), "epoch_end")
        if self._signal_received.is_set():
            self._announce_preemption(iterations)
            self.model.stop_training = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._resume_pending is not None:  # the backup's epoch was the last: no step ran
            position, _ = self._resume_pending
            self._resume_pending = None
            self._announce_resume(position, resumed_after_step=position.step_in_epoch)
        self._end_fit()
        if self._preempted:
            raise SystemExit(EXIT_PREEMPTED)
        if self.delete_checkpoint and self._is_chief:
            _backup.remove(self.backup_dir)
        shutil.rmtree(os.path.join(self.backup_dir, _PREEMPTION_DIR), ignore_errors=True)

    def _after_execution(self):
        """After each call of the train function: a batch hook would make Keras wait for every step."""
        self._batches += self.model.steps_per_execution
        if self._handler is not None:  # calls `_save_preempted` on every worker at one step
            self._handler.run(_no_step)
        elif self._signal_received.is_set() and not self._preempted:
            self._save_preempted()
        if self._preempted:
            self.model.stop_training = True
            return
        if _backup.save_is_due(self._batches, self._last_saved_batches, self.save_every_n_steps):
            self._save(self._mid_epoch_position(), "every_n_steps")

    def _see_iterator(self, iterator):
        self._changes.watch(iterator)  # held by the fit while it runs: freed, the fit is over
        self._train_hook.before = None  # until the next epoch
        self._training_data = _resume.TrainingData.behind(iterator)
        if self._resume_pending is not None:
            position, saved_plan = self._resume_pending
            self._resume_pending = None
            self._position_data(position, saved_plan)

    def _end_fit(self):
        """Undoes what this callback changed in the process for the fit (idempotent)."""
        if self._changes is not None:
            self._changes.end()

    def _variables(self):
        variables = _training_state.training_variables(self.model)
        return variables, [_backup.variable_spec(v.path, v.shape, v.dtype) for v in variables]

    def _trained_in_epoch(self):
        """The batches trained in this epoch: the epoch's last call may read fewer than
        steps_per_execution, but no more than the epoch has left."""
        trained = self._batches - self._epoch_start_batches
        steps = self.params.get("steps")
        return min(trained, steps - self._steps_skipped) if steps else trained

    def _mid_epoch_position(self):
        step_in_epoch = self._steps_skipped + self._trained_in_epoch()
        data_pass = None if self._training_data is None else self._training_data.pass_in_progress
        iterations = self._batch_counter.read()
        return _backup.Position(self._epoch, step_in_epoch, iterations, data_pass)

    def _save(self, position, reason):
        self._last_saved_batches = self._batches
        if not self._is_chief:
            return
        variables, specs = self._variables()
        data = self._training_data
        header = {
            "reason": reason,
            "position": dataclasses.asdict(position),
            "steps_per_epoch": self.params.get("steps"),
            "data_plan": _backup.plan_summary(None if data is None else data.plan),
        }
        strategy = self.model.distribute_strategy
        values = [np.asarray(_topology.local_copy(v, strategy).numpy()) for v in variables]
        _backup.write(self.backup_dir, values=values, specs=specs, header=header)

    def _save_preempted(self):
        position = self._mid_epoch_position()
        steps_per_epoch = self.params.get("steps")
        if steps_per_epoch and position.step_in_epoch >= steps_per_epoch:
            self._signal_received.set()  # the epoch's end saves, then training stops
            return
        self._save(position, "preemption")
        self._announce_preemption(position.iterations)

    def _announce_preemption(self, iterations):
        self._preempted = True
        logger.warning(
            "Preemption notice (SIGTERM): %s a backup at optimizer step %d in %s; "
            "exiting with status %d. Run the same script again to resume.",
            "saved" if self._is_chief else "the chief saved",
            iterations,
            self.backup_dir,
            EXIT_PREEMPTED,
        )

    def _restore(self):
        backup = _backup.read(self.backup_dir)  # raises on a corrupt file
        if self._is_chief:
            _backup.remove_temporary_files(self.backup_dir)
        if backup is None:
            return
        header, raw_values = backup
        optimizer = self.model.optimizer
        if not optimizer.built:  # Keras builds it at the first step; the values need it now
            with self.model.distribute_strategy.scope():
                optimizer.build(self.model.trainable_variables)
        variables, specs = self._variables()
        differences = _backup.variable_differences(header["variables"], specs)
        unbuilt = _step_counter.unbuilt_held_optimizers(self.model)
        if differences and unbuilt:
            raise ValueError(
                f"BackupAndRestore cannot restore model.{unbuilt[0]}: it is not built yet. "
                f"Build it before fit, in the strategy's scope: model.{unbuilt[0]}.build(<the "
                "variables it trains>), as a model that steps optimizers of its own must "
                "under tf.distribute"
            )
        if differences:
            raise _backup.mismatch_error(self.backup_dir, "model", differences)
        for variable, raw, spec in zip(variables, raw_values, header["variables"]):
            variable.assign(_backup.decode(raw, spec, tf.as_dtype(variable.dtype).as_numpy_dtype))
        position = _backup.Position(**header["position"])
        if hasattr(self.model, "_initial_epoch"):
            self.model._initial_epoch = position.epoch
        else:
            self._warn_once(
                "epoch",
                f"Keras {keras.__version__} has no _initial_epoch: training restarts at epoch 0 with the restored weights",
            )
        # The data is found, and the resume announced, before the first step.
        self._resume_pending = (position, header.get("data_plan"))

    def _position_data(self, position, saved_plan):
        """Before a resumed fit's first step: the saved epoch's order, its trained steps to skip."""
        data = self._training_data
        plan = None if data is None else _backup.plan_summary(data.plan)
        differences = _backup.plan_differences(saved_plan, plan)
        if differences:
            self._end_fit()
            raise _backup.mismatch_error(self.backup_dir, "data plan", differences)
        steps_to_skip = position.step_in_epoch
        why = _resume.why_not_exact(data, self.params.get("steps"))
        if not why and position.data_pass is None and data.plan.shuffle:
            why = "the backup does not say which pass over the data its epoch read"
        if why:
            self._announce_resume(position, resumed_after_step=0)
            if steps_to_skip:
                self._warn_once(
                    "skip",
                    f"{why}: resuming at the start of epoch {position.epoch + 1}, so its first "
                    f"{steps_to_skip} steps are trained again, as Keras does; "
                    "keras_scaling.data.distribute resumes exactly",
                )
            return
        data.read_pass_next(position.data_pass)  # data in order has no pass to set
        steps_per_execution = self.model.steps_per_execution
        retrained = steps_to_skip % steps_per_execution
        if retrained:  # skipping part of an execution would leave the epoch's last batches unread
            self._warn_once(
                "steps_per_execution",
                f"the backup's step {steps_to_skip} is not a multiple of steps_per_execution="
                f"{steps_per_execution}: its last {retrained} steps are trained again",
            )
        self._steps_skipped = steps_to_skip - retrained
        self._announce_resume(position, resumed_after_step=self._steps_skipped)
        if self._steps_skipped:
            self._train_hook.skip = _resume.BatchSkipper(self.model, self._steps_skipped)

    def _announce_resume(self, position, resumed_after_step):
        """Says once, as a warning, where training resumed and from which file."""
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        where = f"epoch {position.epoch + 1}/{epochs or '?'}, after its step {resumed_after_step}"
        where += f" of {steps}" if steps else ""
        if epochs is not None and position.epoch >= epochs:
            where = f"nothing left to train (epochs={epochs})"
        logger.warning(
            "BackupAndRestore: resuming from %s (saved at optimizer step %d): %s.",
            _backup.backup_path(self.backup_dir),
            position.iterations,
            where,
        )

    def _watch_for_preemption(self, strategy):
        # The multi-worker handler installs a signal handler too, which raises
        # outside the main thread (Ray Train's train loop runs in a thread).
        if threading.current_thread() is not threading.main_thread():
            self._warn_once("thread", "fit runs outside the main thread: no save on SIGTERM")
            return
        multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        if not multi_worker or _topology.num_workers(strategy) < 2:
            self._previous_sigterm_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._changes.add(self._stop_watching)
        elif self._handler is None:
            config = tf.distribute.experimental.TerminationConfig(
                exit_fn=_no_step, save_fn=self._save_preempted, grace_period=0
            )
            # With a save_fn its checkpoint is never written; workers' scratch goes under it.
            directory = os.path.join(self.backup_dir, _PREEMPTION_DIR, "handler")
            self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
                strategy.cluster_resolver, tf.train.Checkpoint(), directory, config
            )

    def _on_sigterm(self, signum, frame):
        if self._changes.fit_is_over():
            # The fit raised: the signal goes where it would have gone without it.
            self._stop_watching()
            signal.raise_signal(signum)
            return
        self._signal_received.set()

    def _stop_watching(self):
        previous = self._previous_sigterm_handler
        # Only the main thread may set it; off it, its next SIGTERM does.
        if previous is None or threading.current_thread() is not threading.main_thread():
            return
        self._previous_sigterm_handler = None
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, previous)

    def _warn_once(self, key, message):
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("BackupAndRestore: %s.", message)


def _no_step():
    """The step already ran in `fit`; the handler only counts calls."""
