"""The one place that writes (and reads back) TensorBoard summaries for keras_scaling.

Summaries go to a run directory of their own, `log_dir/scaling`, beside the
`log_dir/train` and `log_dir/validation` that `keras.callbacks.TensorBoard`
writes: TensorBoard expects one writer per run directory, and its Python
loader (`--load_fast=false`), watching a run live, moves on to the newest
event file of a directory and never reads the others again. So every
summary of a run directory (scalars, text, images, the Custom Scalars layout)
goes into ONE event file per process at a time, written by TensorBoard's
own event file writer without TensorFlow summary ops. A callback holds the
file for the length of a `fit` (`hold`, `release`): the last release closes
it, and so does the process's exit.
"""

import atexit
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

# Every TensorBoard module is imported here, on the thread that imports this
# one, not when the first file opens: that happens on a callback's save
# thread, and an import there racing one on fit's thread (Keras' TensorBoard
# callback loads TensorBoard's TensorFlow stub too) can see a partly
# initialised module. None of them loads TensorFlow.
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import (
    event_pb2,
    summary_pb2,
    tensor_pb2,
    tensor_shape_pb2,
    types_pb2,
)
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
from tensorboard.plugins.image import metadata as image_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

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

# Held by every write, flush, open and close of an event file (an RLock: a
# write may open the file it writes to).
_lock = threading.RLock()
_event_files: dict[str, "_EventFile"] = {}  # run directory: its open _EventFile
_holds: dict[str, int] = {}  # run directory: how many holds keep its file open
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

    The values are the scalar plugin's float32 tensors; a tag's first event
    in the file carries its description from `TAG_DESCRIPTIONS`. The event
    is queued for the event file's writer thread (see `_EventFile`).

    Args:
        log_dir: str or path, the log directory.
        step: int, the step of every value.
        scalars: dict from tag to a number.
        run: str, the run directory under `log_dir`; default `"scaling"`.
    """
    values = [(tag, _float_tensor(value)) for tag, value in scalars.items()]
    _write_values(log_dir, run, step, values, scalar_metadata.create_summary_metadata)


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
    tensor = _string_tensor([markdown.encode("utf-8")], shape=[])
    _write_values(log_dir, run, step, [(tag, tensor)], text_metadata.create_summary_metadata, flush)


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
    width, height = _png_size(png_bytes)
    # The image plugin's tensor: width, height, then the encoded images.
    tensor = _string_tensor(
        [str(width).encode(), str(height).encode(), bytes(png_bytes)], shape=[3]
    )
    _write_values(log_dir, run, step, [(tag, tensor)], image_metadata.create_summary_metadata, True)


def write_custom_scalars_layout(log_dir, layout, run=RUN, flush=True):
    """Writes a Custom Scalars dashboard layout (a `layout_pb2.Layout`).

    Args:
        log_dir: str or path, the log directory.
        layout: `tensorboard.plugins.custom_scalar.layout_pb2.Layout`.
        run: str, the run directory under `log_dir`; default `"scaling"`.
        flush: bool, whether to flush the event file; default True.
    """
    tensor = _string_tensor([layout.SerializeToString()], shape=[])
    _write_values(
        log_dir,
        run,
        0,
        [(custom_scalar_metadata.CONFIG_SUMMARY_TAG, tensor)],
        lambda display_name, description: custom_scalar_metadata.create_summary_metadata(),
        flush,
    )


def flush(log_dir, run=RUN):
    """Flushes the event file of `log_dir/scaling`, if this process has one open.

    Args:
        log_dir: str or path, the log directory.
        run: str, the run directory under `log_dir`; default `"scaling"`.
    """
    with _lock:
        event_file = _event_files.get(_key(log_dir, run))
        if event_file is not None:
            event_file.flush()


def hold(log_dir, run=RUN):
    """Keeps the event file of `log_dir/run` open until the matching `release`.

    A callback holds its log directory for the length of a `fit` (and
    releases it when that `fit` ends, however it ends), so that the file
    opened by the first write of the `fit` is closed at its end. Holds
    count: the file of a directory two callbacks write to stays open until
    both released it.

    Args:
        log_dir: str or path, the log directory.
        run: str, the run directory under `log_dir`; default `"scaling"`.
    """
    key = _key(log_dir, run)
    with _lock:
        _holds[key] = _holds.get(key, 0) + 1


def release(log_dir, run=RUN):
    """Ends one `hold` of `log_dir/run`; the last one flushes and closes its event file.

    A release without a hold is ignored, so a callback may release again on
    every path by which a `fit` ends.

    Args:
        log_dir: str or path, the log directory.
        run: str, the run directory under `log_dir`; default `"scaling"`.
    """
    key = _key(log_dir, run)
    with _lock:
        count = _holds.get(key, 0)
        if count > 1:
            _holds[key] = count - 1
            return
        _holds.pop(key, None)
        if count == 1:
            _close(key)


def close_all():
    """Flushes and closes every event file this process has open (also run at exit)."""
    with _lock:
        _holds.clear()
        for key in list(_event_files):
            _close(key)


def open_event_files():
    """The paths of the event files this process has open now.

    Returns:
        A list of str.
    """
    with _lock:
        return [event_file.path for event_file in _event_files.values()]


def _close(key):
    event_file = _event_files.pop(key, None)
    if event_file is not None:
        event_file.close()


def _key(log_dir, run):
    return os.path.abspath(run_dir(log_dir, run))


def _write_values(log_dir, run, step, values, create_metadata, flush=False):
    """Writes `[(tag, TensorProto)]` as one event, under the lock of every write and flush."""
    key = _key(log_dir, run)
    with _lock:
        event_file = _event_files.get(key)
        if event_file is None:
            event_file = _event_files[key] = _EventFile(key)
        event_file.write_values(step, values, create_metadata)
        if flush:
            event_file.flush()


class _SynchronousWriter:
    """TensorBoard's record framing into a file, without TensorFlow and without a thread.

    A process that has not loaded TensorFlow (the parent of `keras-scaling
    bench`, which writes a plot and a table) writes its few events with it:
    TensorBoard's `EventFileWriter` opens its file through TensorFlow's file
    system layer, and so loads TensorFlow, which takes seconds.
    """

    def __init__(self, path, flush_secs):
        self._records = RecordWriter(open(path, "wb"))
        self._flush_secs = flush_secs
        self._flushed_at = time.monotonic()
        self.add_event(_file_version_event())
        self.flush()

    def add_event(self, event):
        self._records.write(event.SerializeToString())
        if time.monotonic() - self._flushed_at >= self._flush_secs:
            self.flush()

    def flush(self):
        self._records.flush()
        self._flushed_at = time.monotonic()

    def close(self):
        self._records.flush()
        self._records.close()


def _file_version_event():
    """The first event of a file, as TensorBoard's `EventFileWriter` writes it."""
    return event_pb2.Event(
        wall_time=time.time(),
        file_version="brain.Event:2",
        source_metadata=event_pb2.SourceMetadata(
            writer="tensorboard.summary.writer.event_file_writer"
        ),
    )


class _EventFile:
    """One event file of this process, written by TensorBoard's own writer.

    Once TensorFlow is loaded (in every training process) that is
    `tensorboard.summary.writer.event_file_writer.EventFileWriter`: the
    caller builds and serializes the event, and TensorBoard's writer thread
    frames, checksums (in Python) and writes it. A point of six scalars
    costs the process about 90 microseconds of CPU time, against about 17
    for the hand-encoded events and TensorFlow's C++ record writer this
    replaced (`benchmarks/event_writes.py`): `ThroughputLogger` writes from
    its save thread, a point every 10 steps or more, and `ReplicaSyncCheck`
    one per check, so neither weighs on a step. Its thread flushes at least every
    `_FLUSH_EVERY_S` seconds, so a process that is killed loses at most the
    last seconds of figures. Every write, flush and close happens under the
    module's `_lock`, so the callbacks that share the file (on `fit`'s thread
    and on the save thread) never interleave.
    """

    _FLUSH_EVERY_S = 5.0

    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        if "tensorflow" in sys.modules:
            # EventFileWriter does not say its file's name; last_step_written
            # needs it to tell this file from earlier ones. Files are opened
            # under `_lock`, so this process's one new file is the one.
            own = f".{socket.gethostname()}.{os.getpid()}."
            before = set(_event_file_paths(directory))
            self._writer = EventFileWriter(
                directory, max_queue_size=100, flush_secs=self._FLUSH_EVERY_S
            )
            (self.path,) = [
                path
                for path in set(_event_file_paths(directory)) - before
                if own in os.path.basename(path)
            ]
        else:
            self.path = os.path.join(
                directory,
                f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
                f".{os.getpid()}.{next(_event_file_ids)}",
            )
            self._writer = _SynchronousWriter(self.path, self._FLUSH_EVERY_S)
        self._tags_seen = set()
        self._last_step = {}  # tag: the largest step written

    def write_values(self, step, tensors, create_metadata):
        """Writes `[(tag, TensorProto)]` as one event at `step`.

        `create_metadata(display_name=, description=)` gives a tag's plugin
        metadata, which TensorBoard needs on the tag's first event only.
        """
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
        self._writer.add_event(
            event_pb2.Event(
                wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values)
            )
        )

    def last_step(self, tags):
        """The largest step at which any of `tags` was written to this file, or -1."""
        return max((self._last_step.get(tag, -1) for tag in tags), default=-1)

    def flush(self):
        self._writer.flush()

    def close(self):
        self._writer.close()


def _float_tensor(value):
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[float(value)])


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

    points: dict[str, list[Point]] = {}
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
        own_last_step = own.last_step(tags) if own is not None else -1
    steps = [own_last_step]  # known without reading it back
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


def _forget_after_fork():
    # A child does not own its parent's files nor their writer threads, and
    # the lock may have been held by a thread the child does not have.
    global _lock
    _lock = threading.RLock()
    _event_files.clear()
    _holds.clear()


atexit.register(close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
