"""The one place that writes (and reads back) TensorBoard summaries for keras_scaling.

Summaries go to a run directory of their own, `log_dir/scaling`, beside the
`log_dir/train` and `log_dir/validation` that `keras.callbacks.TensorBoard`
writes: TensorBoard expects one writer per run directory, and its Python
loader (`--load_fast=false`), watching a run live, moves on to the newest
event file of a directory and never reads the others again. So every
summary of a run directory (scalars, text, images, the Custom Scalars layout)
goes into ONE event file per process, built in Python and written without
TensorFlow summary ops.
"""

import collections
import errno
import glob
import itertools
import os
import socket
import struct
import sys
import threading
import time

from tensorboard.compat.proto import (
    event_pb2,
    summary_pb2,
    tensor_pb2,
    tensor_shape_pb2,
    types_pb2,
)
from tensorboard.plugins.scalar import metadata as scalar_metadata

# The run directory, under a log directory, that holds keras_scaling's summaries.
RUN = "scaling"

# Shown by TensorBoard beside each chart (summary metadata), written with the
# first event of each tag in an event file.
TAG_DESCRIPTIONS = {
    "throughput/samples_per_sec": (
        "Training samples per second, all replicas together, measured between "
        "two reads of the optimizer's step counter (warm-up left out)."
    ),
    "throughput/steps_per_sec": "Optimizer steps per second.",
    "throughput/per_replica_samples_per_sec": (
        "throughput/samples_per_sec divided by the number of replicas."
    ),
    "throughput/startup_time_s": (
        "Seconds from the start of fit to the end of its first execution "
        "(tracing and compilation included)."
    ),
    "throughput/tflops_per_sec": (
        "Model TFLOP/s, all replicas: FLOPs of one training sample times samples/sec, over 1e12."
    ),
    "throughput/per_replica_tflops_per_sec": (
        "throughput/tflops_per_sec divided by the number of replicas."
    ),
    "throughput/gflops_per_sec": (
        "Model GFLOP/s (on CPUs), all replicas: FLOPs of one training sample "
        "times samples/sec, over 1e9."
    ),
    "throughput/per_replica_gflops_per_sec": (
        "throughput/gflops_per_sec divided by the number of replicas."
    ),
    "throughput/mfu": (
        "Model FLOPs utilization, a fraction: achieved FLOP/s over the peak "
        "FLOP/s of all replicas' devices. 1.0 would be every device busy with "
        "the model's arithmetic all the time."
    ),
    "scaling/speedup": (
        "samples/sec over the baseline's samples/sec (one replica, same "
        "per-replica batch). Compare with scaling/ideal_speedup."
    ),
    "scaling/ideal_speedup": (
        "The speedup of perfect scaling: replicas divided by the baseline's replicas."
    ),
    "scaling/efficiency": (
        "scaling/speedup over scaling/ideal_speedup: 1.0 is perfect scaling, "
        "0.5 means half of the added replicas' work is lost."
    ),
    "replica_sync/max_abs_diff": (
        "Largest absolute difference between a variable's copy on any replica "
        "and replica 0's. 0 means every replica holds the same values (in "
        "sync); above 0, the replicas' copies have diverged (see the log for "
        "the variables and the likely cause)."
    ),
    "replica_sync/diverged_variables": (
        "Number of variables whose copies differ between replicas. 0 means "
        "every replica holds the same values (in sync); above 0, that many "
        "variables have diverged (see the log for which, and why)."
    ),
    "throughput/setup": "The run's set-up: strategy, workers, replicas, batch sizes.",
    "throughput/setup_baseline": "What the speedup is measured against, and what it means.",
    "throughput/setup_measuring": (
        "How throughput is measured: how often, what is left out, the FLOPs counted."
    ),
    "throughput/advice": "Advice from the run's figures, each given once.",
    "scaling/table": "keras-scaling bench: the sweep's table of speedup and efficiency.",
    "scaling/speedup_vs_replicas": (
        "keras-scaling bench: measured speedup against replicas, with the ideal."
    ),
    "scaling/efficiency_vs_per_replica_batch": (
        "keras-scaling bench: scaling efficiency against per-replica batch."
    ),
}

_lock = threading.Lock()
_event_files = {}
_event_file_ids = itertools.count()


def run_dir(log_dir, run=RUN):
    """The run directory under `log_dir` that holds keras_scaling's summaries.

    Args:
        log_dir: str or path, a log directory (as given to
            `keras.callbacks.TensorBoard`).
        run: str, the run's name under `log_dir`; default `"scaling"`.

    Returns:
        str, `log_dir/run` (for example `log_dir/scaling`).
    """
    return os.path.join(os.fspath(log_dir), run)


def check_log_dir(log_dir, parameter="log_dir", run=RUN):
    """Creates `log_dir/run` and raises a clear error when it cannot be written.

    Args:
        log_dir: str or path.
        parameter: str, the name the error messages give `log_dir`.
        run: str, the run directory to create under `log_dir`.

    Returns:
        str, the absolute `log_dir`.

    Raises:
        TypeError: `log_dir` is not a path.
        ValueError: the directory cannot be created or written.
    """
    log_dir = _absolute_log_dir(log_dir, parameter)
    try:
        os.makedirs(run_dir(log_dir, run), exist_ok=True)
    except OSError as error:
        raise ValueError(_cannot_be_created(parameter, log_dir, error.strerror)) from None
    _check_writable(run_dir(log_dir, run), parameter, log_dir)
    return log_dir


def check_log_dir_can_be_made(log_dir, parameter="log_dir", run=RUN):
    """`check_log_dir` without creating anything: `make_run_dir` creates it later.

    Creating two directories can take a few tenths of a millisecond, about
    0.1% of a `fit` of a few hundred short steps: `ThroughputLogger` leaves
    it to its save thread, which works while training goes on.
    The nearest existing directory on the way to `log_dir/run` must be one
    this process can write to.

    Args:
        log_dir: str or path.
        parameter: str, the name the error messages give `log_dir`.
        run: str, the run directory under `log_dir`.

    Returns:
        str, the absolute `log_dir`.

    Raises:
        TypeError: `log_dir` is not a path.
        ValueError: the directory cannot be created or written.
    """
    log_dir = _absolute_log_dir(log_dir, parameter)
    existing = run_dir(log_dir, run)
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        raise ValueError(_cannot_be_created(parameter, log_dir, os.strerror(errno.ENOTDIR)))
    _check_writable(existing, parameter, log_dir)
    return log_dir


def make_run_dir(log_dir, run=RUN):
    """Creates `log_dir/run`; True when this call created it, False when it was there.

    Args:
        log_dir: str or path.
        run: str, the run directory under `log_dir`.

    Returns:
        bool.
    """
    try:
        os.makedirs(run_dir(log_dir, run))
    except FileExistsError:
        return False
    return True


def _absolute_log_dir(log_dir, parameter):
    if not isinstance(log_dir, (str, os.PathLike)):
        raise TypeError(
            f"{parameter} must be a path (str or os.PathLike), got {type(log_dir).__name__}"
        )
    return os.path.abspath(os.fspath(log_dir))


def _cannot_be_created(parameter, log_dir, reason):
    return (
        f"{parameter}={log_dir!r} cannot be created ({reason}); pass a directory you can write to"
    )


def _check_writable(directory, parameter, log_dir):
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(
            f"{parameter}={log_dir!r} is not writable; pass a directory you can write to"
        )


# Writing.


def write_scalars(log_dir, step, scalars, run=RUN):
    """Writes `{tag: number}` at `step` to `log_dir/scaling`, in one event.

    The event is encoded in Python and written in this thread (about twenty
    microseconds, where a `tf.summary.scalar` op costs about a millisecond),
    as the scalar plugin's float tensors. A tag's first event in the file
    carries its description from `TAG_DESCRIPTIONS`.

    Args:
        log_dir: str or path, the log directory.
        step: int, the step of every value.
        scalars: dict from tag to a number.
        run: str, the run directory under `log_dir`; default `"scaling"`.
    """
    _event_file(log_dir, run).write_scalars(step, scalars)


def write_text(log_dir, step, tag, markdown, run=RUN, flush=True):
    """Writes a Markdown text summary to `log_dir/scaling`.

    Args:
        log_dir: str or path, the log directory.
        step: int.
        tag: str.
        markdown: str, shown rendered in TensorBoard's Text dashboard.
        run: str, the run directory under `log_dir`; default `"scaling"`.
        flush: bool, whether to flush the event file; default True. A caller
            that writes several summaries and then calls `flush` passes False.
    """
    from tensorboard.plugins.text import metadata

    tensor = _string_tensor([markdown.encode("utf-8")], shape=[])
    event_file = _event_file(log_dir, run)
    event_file.write_values(step, [(tag, tensor)], metadata.create_summary_metadata)
    if flush:
        event_file.flush()


def write_image(log_dir, step, tag, png_bytes, run=RUN):
    """Writes one PNG image (encoded bytes) to `log_dir/scaling` and flushes it.

    Args:
        log_dir: str or path, the log directory.
        step: int.
        tag: str.
        png_bytes: bytes, a PNG file's content.
        run: str, the run directory under `log_dir`; default `"scaling"`.

    Raises:
        ValueError: `png_bytes` is not a PNG image.
    """
    from tensorboard.plugins.image import metadata

    width, height = _png_size(png_bytes)
    # The image plugin's tensor: width, height, then the encoded images.
    tensor = _string_tensor(
        [str(width).encode(), str(height).encode(), bytes(png_bytes)], shape=[3]
    )
    event_file = _event_file(log_dir, run)
    event_file.write_values(step, [(tag, tensor)], metadata.create_summary_metadata)
    event_file.flush()


def write_custom_scalars_layout(log_dir, layout, run=RUN, flush=True):
    """Writes a Custom Scalars dashboard layout (a `layout_pb2.Layout`).

    Args:
        log_dir: str or path, the log directory.
        layout: `tensorboard.plugins.custom_scalar.layout_pb2.Layout`.
        run: str, the run directory under `log_dir`; default `"scaling"`.
        flush: bool, whether to flush the event file; default True.
    """
    from tensorboard.plugins.custom_scalar import metadata

    tensor = _string_tensor([layout.SerializeToString()], shape=[])
    event_file = _event_file(log_dir, run)
    event_file.write_values(
        0,
        [(metadata.CONFIG_SUMMARY_TAG, tensor)],
        lambda display_name, description: metadata.create_summary_metadata(),
    )
    if flush:
        event_file.flush()


def flush(log_dir, run=RUN):
    """Flushes the event file of `log_dir/scaling`, if this process opened one.

    Args:
        log_dir: str or path, the log directory.
        run: str, the run directory under `log_dir`; default `"scaling"`.
    """
    with _lock:
        event_file = _event_files.get(os.path.abspath(run_dir(log_dir, run)))
    if event_file is not None:
        event_file.flush()


def _record_writer(path):
    """A TFRecord writer of `path`: TensorFlow's, which checksums in C++, once TensorFlow is loaded.

    A process that has not loaded TensorFlow (the parent of `keras-scaling
    bench`, which writes a plot and a table) frames its few records with
    TensorBoard's Python writer, rather than spend seconds loading TensorFlow.
    """
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        return tf.io.TFRecordWriter(path)
    from tensorboard.summary.writer.record_writer import RecordWriter

    return RecordWriter(open(path, "wb"))


class _EventFile:
    """One event file, written directly, without a thread of its own.

    Event files are TFRecord files, and `tf.io.TFRecordWriter` frames and
    checksums each record in C++. TensorBoard's `EventFileWriter` instead
    hands each event to a writer thread that computes checksums in Python,
    competing for the GIL with training (`_record_writer` says when Python
    framing is used all the same). It is flushed on a write at least
    `_FLUSH_EVERY_S` seconds after the last flush, so a process that is
    killed loses at most the last seconds of figures.
    """

    _FLUSH_EVERY_S = 5.0

    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
            f".{os.getpid()}.{next(_event_file_ids)}"
        )
        self.path = os.path.join(directory, name)
        self._records = _record_writer(self.path)
        self._lock = threading.Lock()
        self._tags_seen = set()
        self._last_step = {}  # tag: the largest step written
        self._flushed_at = time.monotonic()
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def write_values(self, step, tensors, create_metadata):
        """Writes `[(tag, TensorProto)]` as one event at `step`.

        `create_metadata(display_name=, description=)` gives a tag's plugin
        metadata, which TensorBoard needs on the tag's first event only.
        """
        with self._lock:
            values = []
            for tag, tensor in tensors:
                value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
                if tag not in self._tags_seen:
                    value.metadata.CopyFrom(
                        create_metadata(display_name=None, description=TAG_DESCRIPTIONS.get(tag))
                    )
                    self._tags_seen.add(tag)
                values.append(value)
                self._last_step[tag] = max(self._last_step.get(tag, -1), int(step))
            self._write(
                event_pb2.Event(
                    wall_time=time.time(),
                    step=int(step),
                    summary=summary_pb2.Summary(value=values),
                )
            )

    def write_scalars(self, step, scalars):
        """Writes `{tag: number}` as one event at `step`, as float32 scalar tensors."""
        step = int(step)
        if step < 0:  # a varint of a negative int64 takes ten bytes: left to protobuf
            values = [(tag, _float_tensor(value)) for tag, value in scalars.items()]
            self.write_values(step, values, scalar_metadata.create_summary_metadata)
            return
        with self._lock:
            values = []
            for tag, value in scalars.items():
                values.append(
                    _scalar_value_bytes(tag, value, with_metadata=tag not in self._tags_seen)
                )
                self._tags_seen.add(tag)
                self._last_step[tag] = max(self._last_step.get(tag, -1), step)
            self._records.write(_scalar_event_bytes(time.time(), step, values))
            self._flush_if_due()

    def last_step(self, tags):
        """The largest step at which any of `tags` was written to this file, or -1."""
        with self._lock:
            return max((self._last_step.get(tag, -1) for tag in tags), default=-1)

    def _write(self, event):
        self._records.write(event.SerializeToString())
        self._flush_if_due()

    def _flush_if_due(self):
        if time.monotonic() - self._flushed_at > self._FLUSH_EVERY_S:
            self._records.flush()
            self._flushed_at = time.monotonic()

    def flush(self):
        self._records.flush()
        self._flushed_at = time.monotonic()


def _event_file(log_dir, run):
    """The `_EventFile` of `log_dir/run`, one per directory and process."""
    path = os.path.abspath(run_dir(log_dir, run))
    with _lock:
        if path not in _event_files:
            _event_files[path] = _EventFile(path)
        return _event_files[path]


def _float_tensor(value):
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[float(value)])


# Scalar events are encoded here rather than built as protobuf messages: in
# Python, writing a point of six scalars took about 45 microseconds built
# from protobuf's classes, and takes about 19 encoded here. The layout is protobuf's wire format for the fields used,
# in field-number order (as protobuf writes them):
#   Event: wall_time = 1 (double), step = 2 (varint), summary = 5
#   Summary: value = 1 (repeated)
#   Summary.Value: tag = 1, tensor = 8, metadata = 9
#   TensorProto: dtype = 1 (DT_FLOAT = 1), float_val = 5 (packed floats)
_FLOAT32_MAX = 3.4028234663852886e38


def _varint(number):
    out = bytearray()
    while number > 0x7F:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _field(key, payload):
    """A length-delimited field: its key byte, the payload's length, the payload."""
    return key + _varint(len(payload)) + payload


_scalar_value_prefixes = {}  # (tag, with_metadata): the value's bytes but its float


def _scalar_value_bytes(tag, value, with_metadata):
    """A `Summary.Value` holding `value` as a float32 scalar tensor, encoded."""
    value = float(value)
    if abs(value) > _FLOAT32_MAX and value == value:  # as float32: infinite
        value = value * float("inf")
    prefix = _scalar_value_prefixes.get((tag, with_metadata))
    if prefix is None:
        prefix = _field(b"\x0a", tag.encode("utf-8"))
        if with_metadata:
            metadata = scalar_metadata.create_summary_metadata(
                display_name=None, description=TAG_DESCRIPTIONS.get(tag)
            )
            suffix = _field(b"\x4a", metadata.SerializeToString())
        else:
            suffix = b""
        prefix = (prefix, suffix)
        _scalar_value_prefixes[(tag, with_metadata)] = prefix
    tensor = b"\x08\x01\x2a\x04" + struct.pack("<f", value)
    return _field(b"\x0a", prefix[0] + b"\x42\x08" + tensor + prefix[1])


def _scalar_event_bytes(wall_time, step, values):
    """An `Event` at `step` (>= 0) whose summary holds the encoded `values`."""
    summary = b"".join(values)
    return (
        b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step) + _field(b"\x2a", summary)
    )


def _string_tensor(strings, shape):
    return tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=size) for size in shape]
        ),
        string_val=strings,
    )


def _png_size(png_bytes):
    """`(width, height)` from a PNG's IHDR chunk."""
    if not isinstance(png_bytes, (bytes, bytearray)) or png_bytes[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(
            f"png_bytes must be the bytes of a PNG file, got "
            f"{type(png_bytes).__name__} starting {bytes(png_bytes[:8])!r}"
        )
    return struct.unpack(">II", png_bytes[16:24])


# Reading back.


def read_summaries(run_dir):
    """Every summary point in the event files of one run directory.

    The one reader of event files, for the code and for the tests: it uses
    TensorBoard's own event loader and keeps every point (nothing purged, so
    a step written twice shows up twice).

    Args:
        run_dir: str or path, a directory holding `events.out.tfevents.*`
            files (for example `log_dir/scaling` or Keras' `log_dir/train`).

    Returns:
        dict from tag to a list of `Point`s: each file's points in the order
        written, the files in name order.
    """
    return _read_summaries(_event_file_paths(run_dir))


def _event_file_paths(run_dir):
    return sorted(glob.glob(os.path.join(os.fspath(run_dir), "events.out.tfevents.*")))


def _read_summaries(paths):
    from tensorboard.backend.event_processing import event_file_loader

    points = {}
    metadata_of = {}
    for path in paths:
        for event in event_file_loader.EventFileLoader(path).Load():
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.HasField("metadata"):
                    metadata_of[value.tag] = value.metadata
                metadata = metadata_of.get(value.tag)
                plugin = metadata.plugin_data.plugin_name if metadata else ""
                description = metadata.summary_description if metadata else ""
                content = _value_content(value, plugin)
                if content is None:
                    continue
                points.setdefault(value.tag, []).append(
                    Point(int(event.step), content, plugin or "scalars", description)
                )
    return points


class Point(collections.namedtuple("Point", "step value plugin description")):
    """One summary point.

    `value` is a float for scalars, a str for text, the PNG bytes for an
    image and the serialized layout (bytes) for a Custom Scalars layout;
    `plugin` is the TensorBoard plugin that shows it, `description` the
    tag's description ("" when none).
    """

    __slots__ = ()


def _value_content(value, plugin):
    from tensorboard.util import tensor_util

    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind != "tensor":
        return None
    if value.tensor.dtype in _NUMBER_DTYPES:
        array = tensor_util.make_ndarray(value.tensor)
        return float(array.reshape(())) if array.size == 1 else None
    strings = list(value.tensor.string_val)
    if plugin == "images" and len(strings) >= 3:
        return strings[2]
    if plugin == "text" and len(strings) == 1:
        return strings[0].decode("utf-8")
    if plugin == "custom_scalars" and len(strings) == 1:
        return strings[0]
    return None


# DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64: the dtypes of scalar summaries.
_NUMBER_DTYPES = (1, 2, 3, 9)


def read_scalars(run_dir):
    """Every scalar point in the event files of one run directory.

    Reads both TF2 tensor summaries and TF1 `simple_value` ones (see
    `read_summaries`).

    Args:
        run_dir: str or path, a directory holding `events.out.tfevents.*`
            files (for example `log_dir/scaling`).

    Returns:
        dict from tag to a list of `(step, value)`: each file's points in
        the order written, the files in name order.
    """
    return {
        tag: [(point.step, point.value) for point in points]
        for tag, points in read_summaries(run_dir).items()
        if isinstance(points[0].value, float)
    }


def last_step_written(log_dir, tags, run=RUN, earlier_files=True):
    """The largest step at which any of `tags` was written in `log_dir/scaling`, or -1.

    A resumed run continues the step axis of the run it resumes; this says
    where that run stopped, so no point is written twice.

    Args:
        log_dir: str or path, the log directory.
        tags: a set of scalar tags.
        run: str, the run directory under `log_dir`; default `"scaling"`.
        earlier_files: bool, whether to read back the event files this
            process did not write; False when the caller created the run
            directory and so knows there are none.

    Returns:
        int.
    """
    directory = os.path.abspath(run_dir(log_dir, run))
    with _lock:
        own = _event_files.get(directory)
    steps = [-1]
    if own is not None:  # known without reading it back
        steps.append(own.last_step(tags))
    others = []
    if earlier_files:
        others = [path for path in _event_file_paths(directory) if own is None or path != own.path]
    if others:
        points = _read_summaries(others)
        steps += [
            point.step
            for tag in tags
            for point in points.get(tag, ())
            if isinstance(point.value, float)
        ]
    return max(steps)
