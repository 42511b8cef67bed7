"""Where `ThroughputLogger`'s figures go: the event file of `log_dir/scaling` and `throughput.json`."""

import os
import time

from keras_scaling.summaries import _tensorboard
from keras_scaling.throughput import _dashboard as dashboard
from keras_scaling.throughput import _run_record

# A rewrite of `throughput.json` costs the training thread about 200 us; an
# epoch's end and the end of `fit`, however it ends, always rewrite it.
_RECORD_EVERY_S = 2.0


class ThroughputWriter:
    """Writes one logger's points, texts and `throughput.json`.

    Points, texts and the layout go to the event file as they come;
    `throughput.json` is rewritten (atomically) at a point when the figures
    changed and the last rewrite is 2 s old, at `save` and at `stop`. A write
    that fails during `fit` (a full disk) does not stop training: `stop`
    raises its error.

    Args:
        log_dir: str, the run's log directory.
        record: callable returning the current `throughput.json` record, or None.
    """

    def __init__(self, log_dir, record):
        self.log_dir = log_dir
        self._record = record
        self._behind = False
        # Read once, before this writer opens a file: no rereading of its own points.
        self._last_written_step = _tensorboard.last_step_written(log_dir, dashboard.SCALAR_TAGS)
        self._error = None
        self._saved_at_s = -_RECORD_EVERY_S
        self.last_step = 0

    def stop(self):
        """Ends a `fit`: rewrites `throughput.json` if behind, closes the event file, raises a failed write's error."""
        try:
            self._save_record()
        finally:
            _tensorboard.close(self.log_dir)
        error, self._error = self._error, None
        if error is not None:
            raise error

    def changed(self):
        """The figures changed: `throughput.json` is behind."""
        self._behind = True

    def scalars(self, step, scalars):
        """Writes `{tag: value}` at `step` unless `log_dir` has that step (an earlier run's too)."""
        self.last_step = max(self.last_step, step)
        self._keeping_errors(self._write_scalars, step, scalars)

    def text(self, step, tag, markdown):
        self._keeping_errors(_tensorboard.write_text, self.log_dir, step, tag, markdown)

    def layout(self, **charts):
        """Writes the Custom Scalars layout of `_dashboard.custom_scalars_layout(**charts)`."""
        layout = dashboard.custom_scalars_layout(**charts)
        self._keeping_errors(_tensorboard.write_custom_scalars_layout, self.log_dir, layout)

    def save(self):
        """Rewrites `throughput.json` if behind, keeping a failure for `stop` (training goes on)."""
        self._keeping_errors(self._save_record)

    def _write_scalars(self, step, scalars):
        if step > self._last_written_step:
            _tensorboard.write_scalars(self.log_dir, step, scalars)
            self._last_written_step = step
        if time.monotonic() - self._saved_at_s >= _RECORD_EVERY_S:
            self._save_record()

    def _save_record(self):
        record = self._record() if self._behind else None
        if record is not None:
            os.makedirs(_tensorboard.run_dir(self.log_dir), exist_ok=True)  # before the first point
            _run_record.write_throughput_json(self.log_dir, record)
            self._saved_at_s = time.monotonic()
        self._behind = False  # left True when the write raised

    def _keeping_errors(self, write, *args, **kwargs):
        try:
            write(*args, **kwargs)
        except Exception as error:  # a full disk, for one: raised at `stop`
            self._error = self._error or error
