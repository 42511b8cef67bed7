"""Saving a callback's figures from a thread of its own, however training stops.

Keras skips `on_train_end` when another callback raises, and a notebook's
process lives on: without this, figures measured so far would stay in a
buffer. The thread wakes every `period_s` seconds and saves only when it has
been told there is news, so an idle run costs one wake-up per period.
"""

import logging
import threading

logger = logging.getLogger("keras_scaling")


class BackgroundSave:
    """Calls `save()` in a daemon thread within `period_s` seconds of `news()`.

    Args:
        save: callable without arguments; it must be safe to call from
            another thread (the caller's lock).
        period_s: float, seconds between checks for news.
        name: str, the thread's name.
    """

    def __init__(self, save, *, period_s=2.0, name="keras_scaling-save"):
        self._save = save
        self._period_s = period_s
        self._has_news = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def news(self):
        """Marks that there is something new to save (a plain assignment: cheap)."""
        self._has_news = True

    def stop(self):
        """Stops the thread, without a last save (the caller saves itself)."""
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _run(self):
        while not self._stopped.wait(self._period_s):
            if not self._has_news:
                continue
            self._has_news = False
            try:
                self._save()
            except Exception:  # the next news tries again; training goes on
                logger.exception("keras_scaling: saving in the background failed")
