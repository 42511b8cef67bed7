"""Where `ThroughputLogger`'s figures go: the event file and `throughput.json`, off `fit`'s loop.

Writes wait in a queue for the process's save thread (`_background_save`),
which runs them soon after they arrive, rewrites `throughput.json` after each epoch
and at most every `record_every_s` seconds, and flushes; `fit`'s loop only
appends to the queue. The first save of each `fit` runs at once: it creates
the run directory and the event file and writes the set-up while training
goes on, rather than leave those file operations to the end of a short
`fit`. `stop()` at the end of a `fit` runs what is left, leaves
`throughput.json` complete and releases the event file, which closes it
unless `ReplicaSyncCheck` still holds it (`_tensorboard.hold`).
"""

import threading
import time

from keras_scaling.summaries import _tensorboard
from keras_scaling.throughput import _background_save, _run_record
from keras_scaling.throughput import _dashboard as dashboard


class ThroughputWriter:
    """Writes one logger's points, texts and run record.

    Args:
        log_dir: str, the run's log directory.
        record: callable returning the current `throughput.json` record, or
            None while there is none; called with `lock` held.
        lock: the lock its caller holds while the figures change.
        record_every_s: float, the longest time between rewrites of
            `throughput.json` while there is news.
    """

    def __init__(self, log_dir, record, lock, *, record_every_s=2.0):
        self.log_dir = log_dir
        self._record = record
        self._lock = lock
        self._record_every_s = record_every_s
        self._pending = []
        self._revision = 0
        self._saved_revision = None
        self._record_due = False
        self._record_saved_s = time.monotonic()
        self._last_written_step = None
        self.last_step = 0
        # Whether the run directory existed before the first save (None until
        # then): only then can it hold steps written by an earlier run.
        self._run_dir_was_there = None
        self._saver = None
        # Held while saving: by the thread, and at the end of a fit. The end
        # of a fit can come from a garbage collection inside a save (Python
        # freed the iterator of a fit that raised): the thread saving then
        # calls `stop()` itself, and its save does what that call asks.
        self._save_lock = threading.RLock()
        self._saving_thread = None
        self._save_again = False
        self._release_after_save = False
        self._holds_event_file = False

    def start(self):
        """Starts saving in the background for a `fit`, and holds its event file open."""
        if not self._holds_event_file:
            _tensorboard.hold(self.log_dir)
            self._holds_event_file = True
        self._record_saved_s = time.monotonic()
        self._saver = _background_save.BackgroundSave(self._save_in_background, first_gap_s=0.0)

    def stop(self):
        """Stops saving in the background, saves what is left, throughput.json included, and releases the event file."""
        try:
            if self._saver is not None:
                # Waits for a background save in progress, so that none runs on
                # while the process exits (after Ctrl-C, for one).
                self._saver.stop()
                self._saver = None
            self.save()
        finally:
            if self._holds_event_file:
                self._holds_event_file = False
                if self._saving_thread == threading.get_ident():
                    self._release_after_save = True
                else:
                    _tensorboard.release(self.log_dir)

    def changed(self, epoch_ended=False):
        """The figures changed (call with the lock held): throughput.json is behind."""
        self._revision += 1
        self._record_due = self._record_due or epoch_ended

    def scalars(self, step, scalars):
        """Writes `{tag: value}` at `step`, unless that step was written before.

        Steps written by an earlier run in this `log_dir` (before a resume)
        count too.
        """
        self.last_step = max(self.last_step, step)

        def write():
            if self._last_written_step is None:
                self._last_written_step = _tensorboard.last_step_written(
                    self.log_dir, dashboard.SCALAR_TAGS, earlier_files=self._run_dir_was_there
                )
            if step > self._last_written_step:
                _tensorboard.write_scalars(self.log_dir, step, scalars)
                self._last_written_step = step

        self._queue(write)

    def text(self, step, tag, markdown):
        """Writes a text summary."""
        self._queue(lambda: _tensorboard.write_text(self.log_dir, step, tag, markdown, flush=False))

    def layout(self, **charts):
        """Writes the Custom Scalars layout of `_throughput_dashboard`, built in the save thread."""
        self._queue(
            lambda: _tensorboard.write_custom_scalars_layout(
                self.log_dir, dashboard.custom_scalars_layout(**charts), flush=False
            )
        )

    def save_soon(self):
        """Has the thread save soon, or saves now when no fit is running.

        Outside a fit the event file is closed again after the save.
        """
        if self._saver is not None:
            self._saver.news()
            return
        _tensorboard.hold(self.log_dir)
        try:
            self.save()
        finally:
            _tensorboard.release(self.log_dir)

    def save(self, record_now=True):
        """Runs the pending writes, rewrites throughput.json if behind, and flushes.

        Returns False when `record_now` is False and throughput.json was left
        behind, to be rewritten later.
        """
        with self._save_lock:
            if self._saving_thread == threading.get_ident():
                self._save_again = True  # the save under way runs again
                return True
            self._saving_thread = threading.get_ident()
            try:
                saved = self._save(record_now)
                while self._save_again:
                    self._save_again = False
                    saved = self._save(record_now=True)
                return saved
            finally:
                self._saving_thread = None
                if self._release_after_save:
                    self._release_after_save = False
                    _tensorboard.release(self.log_dir)

    def _save(self, record_now):
        """One pass of `save`, its lock held."""
        with self._lock:
            writes, self._pending = self._pending, []
            revision = self._revision
            behind = self._saved_revision != revision
            record = self._record() if behind and record_now else None
        if (writes or record is not None) and self._run_dir_was_there is None:
            self._run_dir_was_there = not _tensorboard.make_run_dir(self.log_dir)
        for write in writes:
            write()
        if record is not None:
            _run_record.write_throughput_json(self.log_dir, record)
            self._saved_revision = revision
            self._record_saved_s = time.monotonic()
        elif behind and record_now:
            self._saved_revision = revision  # nothing to write yet
        if writes or record is not None:
            _tensorboard.flush(self.log_dir)
        return record_now or not behind

    def _queue(self, write):
        with self._lock:
            self._pending.append(write)
        self.save_soon()

    def _save_in_background(self):
        record_now = (
            self._record_due or time.monotonic() - self._record_saved_s >= self._record_every_s
        )
        self._record_due = False
        return self.save(record_now)
