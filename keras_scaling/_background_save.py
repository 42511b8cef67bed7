"""Saving a callback's figures from a thread of its own, however training stops.

Keras skips `on_train_end` when another callback raises, and a notebook's
process lives on: without this, figures measured so far would stay in a
buffer. Saving here also keeps file writes off `fit`'s loop: the thread
saves soon after it is told there is news, at most once per `min_gap_s`
seconds, so a run with short steps costs its loop a flag and an event.
"""

import logging
import threading

logger = logging.getLogger("keras_scaling")


class BackgroundSave:
    """Calls `save()` in a daemon thread soon after `news()`.

    Args:
        save: callable without arguments; it must be safe to call from
            another thread (the caller's lock). When it returns False, it
            is called again after `period_s` seconds without news.
        period_s: float, the longest time from `news()` to its save.
        min_gap_s: float, the shortest time between two saves.
        name: str, the thread's name.
    """

    def __init__(self, save, *, period_s=2.0, min_gap_s=0.25, name="keras_scaling-save"):
        self._save = save
        self._period_s = period_s
        self._min_gap_s = min(min_gap_s, period_s)
        self._has_news = False
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def news(self):
        """Marks that there is something new to save, and wakes the thread."""
        self._has_news = True
        self._wake.set()

    def stop(self):
        """Stops the thread and waits for it, without a last save (the caller saves itself)."""
        self._stopped.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _run(self):
        while True:
            self._wake.wait(self._period_s)
            self._wake.clear()
            if self._stopped.is_set():
                return
            if not self._has_news:
                continue
            self._has_news = False
            try:
                if self._save() is False:
                    self._has_news = True  # not all saved: again after a period
            except Exception:  # the next news tries again; training goes on
                logger.exception("keras_scaling: saving in the background failed")
            if self._stopped.wait(self._min_gap_s):
                return
