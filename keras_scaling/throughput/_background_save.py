"""Saving a callback's figures from a thread, however training stops.

Keras skips `on_train_end` when another callback raises, and a notebook's
process lives on: without this, figures measured so far would stay in a
buffer. Saving here also keeps file writes off `fit`'s loop: the first save
runs `first_gap_s` after the start, the next ones at least `min_gap_s` (a
second) apart, each once there is news, so a run with short steps costs its
loop a flag (and one wake of the thread per save), and news within the same
second is saved in one go.

One daemon thread per process runs every `BackgroundSave`: starting a thread
for each `fit` cost the loop about a millisecond, waiting for it to start.
"""

import logging
import os
import threading
import time

logger = logging.getLogger("keras_scaling")


class BackgroundSave:
    """Calls `save()` in the process's save thread soon after `news()`.

    Args:
        save: callable without arguments; it must be safe to call from
            another thread (the caller's lock). When it returns False, it
            is called again after `period_s` seconds without news.
        period_s: float, the time after which a save that returned False is
            tried again.
        min_gap_s: float, the shortest time between two saves.
        first_gap_s: float, the time from the start to the first save;
            default None means `min_gap_s`.
    """

    def __init__(self, save, *, period_s=2.0, min_gap_s=1.0, first_gap_s=None):
        self._save = save
        self._period_s = period_s
        self._min_gap_s = min(min_gap_s, period_s)
        self._has_news = False
        self._retry_s = None  # when to save again without news
        if first_gap_s is None:
            first_gap_s = self._min_gap_s
        self._not_before_s = time.monotonic() + first_gap_s
        self._stopped = False
        self._saving = threading.Lock()  # held while its save runs
        _save_thread.add(self)

    def news(self):
        """Marks that there is something new to save, and wakes the thread unless it knows."""
        if not self._has_news:
            self._has_news = True
            _save_thread.wake()

    def stop(self):
        """Stops the saves and waits for one in progress, without a last save (the caller saves itself)."""
        self._stopped = True
        _save_thread.remove(self)
        if not _save_thread.is_current():
            with self._saving:
                pass

    def _due_s(self):
        """When its next save is due, or None."""
        if self._stopped:
            return None
        if self._has_news:
            return self._not_before_s
        return self._retry_s

    def _run(self):
        with self._saving:
            if self._stopped:
                return
            self._has_news = False
            self._retry_s = None
            try:
                if self._save() is False:  # not all saved: again after a period
                    self._retry_s = time.monotonic() + self._period_s
            except Exception:  # the next news tries again; training goes on
                logger.exception("keras_scaling: saving in the background failed")
            self._not_before_s = time.monotonic() + self._min_gap_s


class _SaveThread:
    """The process's one save thread: runs each registered save when it is due."""

    def __init__(self):
        # Reentrant: a garbage collection while it is held can end a fit,
        # whose writer then removes its saver here, on the same thread.
        self._lock = threading.RLock()
        self._savers = []
        self._wake = threading.Event()
        self._thread = None

    def add(self, saver):
        with self._lock:
            self._savers.append(saver)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="keras_scaling-save", daemon=True
                )
                self._thread.start()

    def remove(self, saver):
        with self._lock:
            if saver in self._savers:
                self._savers.remove(saver)

    def wake(self):
        self._wake.set()

    def is_current(self):
        return threading.current_thread() is self._thread

    def reset_after_fork(self):
        # The child has no save thread; the next saver starts one.
        self._lock = threading.RLock()
        self._savers = []
        self._wake = threading.Event()
        self._thread = None

    def _loop(self):
        while True:
            with self._lock:
                savers = list(self._savers)
            now_s = time.monotonic()
            for saver in savers:
                due_s = saver._due_s()
                if due_s is not None and due_s <= now_s:
                    saver._run()
            due = [s for s in (saver._due_s() for saver in savers) if s is not None]
            self._wake.wait(max(0.0, min(due) - time.monotonic()) if due else None)
            # Cleared before the savers are read again: news arriving from
            # here on is either seen by that reading or wakes the next wait.
            self._wake.clear()


_save_thread = _SaveThread()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_save_thread.reset_after_fork)
