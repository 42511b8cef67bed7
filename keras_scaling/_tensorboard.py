"""The one place that writes TensorBoard summaries for keras_scaling.

Summaries go to `log_dir/train`, the directory `keras.callbacks.TensorBoard`
writes to, so keras_scaling's scalars sit beside the loss.
"""

import itertools
import os
import socket
import threading
import time

import tensorflow as tf

_writers = {}
_lock = threading.Lock()


def last_step_written(log_dir, tags):
    """The largest step at which any of `tags` was written in `log_dir/train`, or -1.

    A resumed run continues the step axis of the run it resumes; this says
    where that run stopped, so no point is written twice.

    Args:
        log_dir: str, the log directory.
        tags: a set of scalar tags.
    """
    import glob

    from tensorboard.backend.event_processing import event_file_loader

    last_step = -1
    pattern = os.path.join(train_dir(log_dir), "events.out.tfevents.*")
    for path in glob.glob(pattern):
        for event in event_file_loader.EventFileLoader(path).Load():
            if event.step <= last_step or not event.HasField("summary"):
                continue
            if any(value.tag in tags for value in event.summary.value):
                last_step = event.step
    return last_step


def read_scalars(run_dir):
    """Every scalar point in the event files of one run directory.

    The one reader of event files, for the code and for the tests: it uses
    TensorBoard's own event loader, keeps every point (nothing purged, so a
    step written twice shows up twice), and reads both TF2 tensor summaries
    and TF1 `simple_value` ones.

    Args:
        run_dir: str, a directory holding `events.out.tfevents.*` files (for
            example `log_dir/train`).

    Returns:
        dict from tag to a list of `(step, value)`: each file's points in
        the order written, the files in name order.
    """
    import glob

    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.util import tensor_util

    points = {}
    for path in sorted(glob.glob(os.path.join(os.fspath(run_dir), "events.out.tfevents.*"))):
        for event in event_file_loader.EventFileLoader(path).Load():
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                kind = value.WhichOneof("value")
                if kind == "simple_value":
                    number = float(value.simple_value)
                elif kind == "tensor" and value.tensor.dtype in _NUMBER_DTYPES:
                    array = tensor_util.make_ndarray(value.tensor)
                    if array.size != 1:
                        continue
                    number = float(array.reshape(()))
                else:
                    continue
                points.setdefault(value.tag, []).append((int(event.step), number))
    return points


# DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64: the dtypes of scalar summaries.
_NUMBER_DTYPES = (1, 2, 3, 9)


def run_dir(log_dir):
    """The run directory under `log_dir` that holds keras_scaling's own summaries."""
    return train_dir(log_dir)


def train_dir(log_dir):
    """`log_dir/train`, where `keras.callbacks.TensorBoard(log_dir)` writes."""
    return os.path.join(os.fspath(log_dir), "train")


def check_log_dir(log_dir, parameter="log_dir"):
    """Creates `log_dir/train` and raises a clear error when it cannot be written.

    Returns the absolute `log_dir`.
    """
    if not isinstance(log_dir, (str, os.PathLike)):
        raise TypeError(
            f"{parameter} must be a path (str or os.PathLike), got "
            f"{type(log_dir).__name__}"
        )
    log_dir = os.path.abspath(os.fspath(log_dir))
    path = train_dir(log_dir)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"{parameter}={log_dir!r} cannot be created ({error.strerror}); "
            "pass a directory you can write to"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(
            f"{parameter}={log_dir!r} is not writable; pass a directory you "
            "can write to"
        )
    return log_dir


def writer(log_dir):
    """The summary writer of `log_dir/train`, one per directory and process."""
    path = os.path.abspath(train_dir(log_dir))
    with _lock:
        if path not in _writers:
            with tf.init_scope():
                _writers[path] = tf.summary.create_file_writer(path)
        return _writers[path]


def write_scalars(log_dir, step, scalars):
    """Writes `{tag: float}` at `step` (an int) to `log_dir/train`."""
    with tf.init_scope(), writer(log_dir).as_default():
        for tag, value in scalars.items():
            tf.summary.scalar(tag, float(value), step=int(step))


def write_scalars_fast(log_dir, step, scalars):
    """Writes `{tag: float}` at `step` to `log_dir/train`, without TensorFlow ops.

    Same events as `write_scalars` (scalar-plugin tensors), for figures written
    while training: the event is built in Python and written in this thread,
    which costs about twenty microseconds where a `tf.summary.scalar` op costs
    about a millisecond. The events go to an event file of their own in
    `log_dir/train`, flushed every few seconds and by `flush(log_dir)`.
    """
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2

    event_file = _event_file(log_dir)
    values = []
    for tag, value in scalars.items():
        summary_value = summary_pb2.Summary.Value(
            tag=tag,
            tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[float(value)]),
        )
        if tag not in event_file.tags_seen:
            # TensorBoard needs the plugin metadata on a tag's first event only.
            summary_value.metadata.CopyFrom(_scalar_metadata())
            event_file.tags_seen.add(tag)
        values.append(summary_value)
    event_file.write(
        event_pb2.Event(
            wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values)
        )
    )


class _EventFile:
    """An event file written directly, without a thread of its own.

    Event files are TFRecord files, and `tf.io.TFRecordWriter` frames and
    checksums each record in C++. TensorBoard's `EventFileWriter` instead
    hands each event to a writer thread that computes checksums in Python,
    competing for the GIL with training. It is flushed at least every
    `_FLUSH_EVERY_S` seconds, so a process that is killed loses at most the
    last seconds of figures.
    """

    _FLUSH_EVERY_S = 5.0

    def __init__(self, directory):
        from tensorboard.compat.proto import event_pb2

        os.makedirs(directory, exist_ok=True)
        name = "events.out.tfevents.%010d.%s.%s.%s" % (
            time.time(), socket.gethostname(), os.getpid(), next(_event_file_ids)
        )
        self._records = tf.io.TFRecordWriter(os.path.join(directory, name))
        self.tags_seen = set()
        self._flushed_at = time.monotonic()
        self.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def write(self, event):
        self._records.write(event.SerializeToString())
        if time.monotonic() - self._flushed_at > self._FLUSH_EVERY_S:
            self.flush()

    def flush(self):
        self._records.flush()
        self._flushed_at = time.monotonic()


_event_files = {}
_event_file_ids = itertools.count()


def _event_file(log_dir):
    """The `_EventFile` of `log_dir/train`, one per directory and process."""
    path = os.path.abspath(train_dir(log_dir))
    with _lock:
        if path not in _event_files:
            _event_files[path] = _EventFile(path)
        return _event_files[path]


def _scalar_metadata():
    from tensorboard.plugins.scalar import metadata

    return metadata.create_summary_metadata(display_name=None, description=None)


def write_text(log_dir, step, tag, markdown):
    """Writes a Markdown text summary to `log_dir/train`."""
    with tf.init_scope(), writer(log_dir).as_default():
        tf.summary.text(tag, markdown, step=int(step))


def write_image(log_dir, step, tag, png_bytes):
    """Writes one PNG image (encoded bytes) to `log_dir/train`."""
    with tf.init_scope(), writer(log_dir).as_default():
        image = tf.image.decode_png(png_bytes, channels=4)
        tf.summary.image(tag, image[tf.newaxis], step=int(step))


def write_custom_scalars_layout(log_dir, layout):
    """Writes a Custom Scalars dashboard layout (a `layout_pb2.Layout`)."""
    from tensorboard.plugins.custom_scalar import summary as custom_scalar_summary

    with tf.init_scope():
        with writer(log_dir).as_default():
            tf.summary.experimental.write_raw_pb(
                custom_scalar_summary.pb(layout).SerializeToString(), step=0
            )


def flush(log_dir):
    """Flushes the writer of `log_dir/train`, if one was opened."""
    path = os.path.abspath(train_dir(log_dir))
    with _lock:
        summary_writer = _writers.get(path)
        event_file = _event_files.get(path)
    if summary_writer is not None:
        with tf.init_scope():
            summary_writer.flush()
    if event_file is not None:
        event_file.flush()
