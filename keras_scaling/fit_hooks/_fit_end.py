"""Undoing what a callback changed for one `fit`, however that `fit` ends.

A callback registers the undo of each change it makes for a `fit` (a SIGTERM
handler, a wrapped train function, a counting `train_step`, its last writes)
in a `FitChanges`. Keras calls `on_train_end` only when `fit` returns, so the
undos run once, at the first of: `on_train_end`; a call of the train function
that raised (Ctrl-C included); Python freeing the data iterator that `fit`
trains from (`watch`), which it does with `fit`'s frame once the exception
of a `fit` that raised between steps is handled (this ends the changes of
every callback of that `fit`); an error leaving the steps of an epoch, such
as another callback raising (`end_fits_when_an_epoch_raises`: Keras' epoch
iterator and its generator form a cycle, so a live process may not free the
iterator until a garbage collection); the start of another `fit` in the
thread (`end_other_fits`); the process's exit.
"""

import atexit
import contextlib
import functools
import importlib
import logging
import threading
import weakref

# Imported first so that its exit handler, which closes the event files,
# runs after this module's, whose undos write their last figures.
from keras_scaling.internals import _probes
from keras_scaling.summaries import _tensorboard  # noqa: F401

logger = logging.getLogger("keras_scaling")

_lock = threading.RLock()  # reentrant: a SIGTERM handler may end changes
_open: dict[int, "FitChanges"] = {}


class FitChanges:
    """The undos of one callback for one `fit`, whose callbacks share `owner` (its `params` dict)."""

    def __init__(self, owner):
        self.owner = owner
        self.thread = threading.get_ident()
        self._undo = []
        self._finalizer = None
        with _lock:
            _open[id(self)] = self

    def add(self, undo):
        """Registers a callable without arguments that undoes one change."""
        self._undo.append(undo)

    def watch(self, iterator):
        """Ends the changes of every callback of this `fit` when `iterator` is freed."""
        watched = self._finalizer.peek() if self._finalizer is not None else None
        if watched is None or watched[0] is not iterator:
            self.unwatch()
            with contextlib.suppress(TypeError):  # no weak references to it: the other ways remain
                self._finalizer = weakref.finalize(iterator, _end_fit, self.owner)

    def unwatch(self):
        """Stops watching: the live `fit` drops its last epoch's iterator (at each epoch's start)."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def fit_is_over(self):
        """Whether the `fit` ended, and the undos ran (see the module's docstring)."""
        return id(self) not in _open

    def end(self):
        """Runs the undos, last first; later calls do nothing."""
        with _lock:
            if _open.pop(id(self), None) is None:
                return
            undo, self._undo = self._undo, []
        self.unwatch()
        for action in reversed(undo):
            try:
                action()
            except Exception:  # one failed undo must not keep the others
                logger.exception("keras_scaling: could not undo a change made for fit")


def _ending(select):
    with _lock:
        changes = [each for each in _open.values() if select(each)]
    for each in changes:
        each.end()


def _end_fit(owner):
    _ending(lambda changes: changes.owner is owner)


def end_other_fits(owner):
    """Ends the changes of this thread's `fit`s other than `owner`'s: a `fit` is starting."""
    thread = threading.get_ident()
    _ending(lambda changes: changes.owner is not owner and changes.thread == thread)


_TF_TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"
_epoch_hook_installed = False


@_probes.guarded(
    "keras.epoch_loop_errors",
    reaches=f"{_TF_TRAINER_MODULE}.TFEpochIterator.catch_stop_iteration",
    lost="after another callback raised in fit, keras_scaling's last figures (throughput.json's) are written when Python frees that fit's data, the next fit starts or the process ends, not at once",
    workaround="Put keras_scaling's callbacks after the callback that may raise, or call fit again to have the last figures written.",
)
def _epoch_iterator_class():
    epoch_iterator = importlib.import_module(_TF_TRAINER_MODULE).TFEpochIterator
    if not callable(epoch_iterator.__dict__.get("catch_stop_iteration")):
        raise _probes.ReachError("TFEpochIterator has no catch_stop_iteration of its own")
    return epoch_iterator


def end_fits_when_an_epoch_raises():
    """Makes an error leaving an epoch's steps end this thread's `fit`s; installed once per process."""
    global _epoch_hook_installed
    with _lock:
        epoch_iterator = None if _epoch_hook_installed else _epoch_iterator_class()
        if epoch_iterator is None:
            return
        original = epoch_iterator.__dict__["catch_stop_iteration"]

        @functools.wraps(original)
        @contextlib.contextmanager
        def catch_stop_iteration(self):
            try:
                with original(self):
                    yield
            except BaseException:
                thread = threading.get_ident()
                _ending(lambda changes: changes.thread == thread)
                raise

        epoch_iterator.catch_stop_iteration = catch_stop_iteration
        _epoch_hook_installed = True


atexit.register(_ending, lambda changes: True)
