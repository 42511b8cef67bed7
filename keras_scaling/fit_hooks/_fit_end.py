"""Undoing what a callback changed in the process when its `fit` ends, however it ends.

A callback may change the process for one `fit`: a SIGTERM handler, a
wrapper around `model.train_function`, a counting `model.train_step`, Keras
patches it enabled on its own. Keras calls `on_train_end` only when `fit`
returns; when `fit` raises (another callback raised, the data failed, Ctrl-C)
it skips it. So each such change is registered in a `FitChanges` and undone
at the first of:

- `on_train_end` (`fit` returned);
- a call of the train function that raised anything but the end of the data,
  Ctrl-C included (the `TrainFunctionHook`'s `on_error`);
- Python freeing the iterator `fit` trains from (`watch`): a `fit` that
  raised between steps and whose exception was handled (or a `fit` left
  unfinished) drops it;
- a SIGTERM while the fit's iterator is no longer alive (`fit_is_over`
  collects garbage first), so that `kill PID` still stops the process;
- the start of another `fit` with a keras_scaling callback (`end_other_fits`):
  in one thread a new `fit` means the earlier one is over;
- the end of the process (`atexit`).
"""

import atexit
import gc
import logging
import threading
import weakref

logger = logging.getLogger("keras_scaling")

_lock = threading.RLock()
_open: dict[int, "FitChanges"] = {}


class FitChanges:
    """The undo actions of one callback for one `fit`.

    Args:
        owner: the `params` dict the callbacks of that `fit` share.
    """

    def __init__(self, owner):
        self.owner = owner
        self.thread = threading.get_ident()
        self._undo = []
        self._finalizer = None
        with _lock:
            _open[id(self)] = self

    @property
    def ended(self):
        """Whether the changes were undone."""
        with _lock:
            return id(self) not in _open

    def add(self, undo):
        """Registers a callable without arguments that undoes one change."""
        self._undo.append(undo)

    def watch(self, token):
        """Ends the changes when `token` (fit's iterator) is freed; replaces any earlier token."""
        if self._finalizer is not None and self._finalizer.peek() is not None:
            if self._finalizer.peek()[0] is token:
                return
        self.unwatch()
        try:
            self._finalizer = weakref.finalize(token, self.end)
        except TypeError:  # no weak references to it: the other ways remain
            self._finalizer = None

    def unwatch(self):
        """Stops watching the current token (it is about to be dropped by a live fit)."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def fit_is_over(self):
        """Whether the fit ended: its iterator, once garbage is collected, is gone.

        A `fit` that is running holds its iterator; one that raised and whose
        exception was handled does not.
        """
        if self.ended:
            return True
        if self._finalizer is None:
            return False
        gc.collect()
        return self.ended

    def end(self):
        """Undoes every change, last first; later calls do nothing."""
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


def end_other_fits(owner):
    """Ends the changes of this thread's fits other than `owner`'s: a fit is starting."""
    thread = threading.get_ident()
    with _lock:
        others = [
            changes
            for changes in _open.values()
            if changes.owner is not owner and changes.thread == thread
        ]
    for changes in others:
        changes.end()


def _end_all():
    with _lock:
        remaining = list(_open.values())
    for changes in remaining:
        changes.end()


atexit.register(_end_all)
