"""The one place that writes (and reads back) keras_scaling's TensorBoard summaries.

One event file per run directory and process, as TensorBoard's loader, watching live, moves on
to a directory's newest file and never rereads the others (docs/reference/tensorboard.md).
"""

import atexit
import collections
import contextlib
import errno
import glob
import itertools
import os
import socket
import struct
import threading
import time

# Imported with this module, not at the first write: TensorBoard's modules
# imported on two threads at once (Keras' TensorBoard callback loads them
# too) can see each other partly initialised. None of them loads TensorFlow.
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
from tensorboard.plugins.image import metadata as image_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

RUN = "scaling"

# Shown beside each chart: the tag's first event in a file carries it.
TAG_DESCRIPTIONS = {
    "throughput/samples_per_sec": "Training samples per second, all replicas, between two reads of the step counter.",
    "throughput/steps_per_sec": "Optimizer steps per second.",
    "throughput/per_replica_samples_per_sec": "throughput/samples_per_sec over the replicas.",
    "throughput/startup_time_s": "Seconds from the start of fit to the end of its first execution.",
    "throughput/tflops_per_sec": "Model TFLOP/s, all replicas: FLOPs per sample times samples/sec.",
    "throughput/per_replica_tflops_per_sec": "throughput/tflops_per_sec over the replicas.",
    "throughput/gflops_per_sec": "Model GFLOP/s, all replicas: FLOPs per sample times samples/sec.",
    "throughput/per_replica_gflops_per_sec": "throughput/gflops_per_sec over the replicas.",
    "throughput/mfu": "Model FLOPs utilization: achieved FLOP/s over all devices' peak (1.0 max).",
    "scaling/speedup": "samples/sec over the baseline's (one replica, same per-replica batch).",
    "scaling/ideal_speedup": "Perfect scaling's speedup: replicas over the baseline's replicas.",
    "scaling/efficiency": "scaling/speedup over scaling/ideal_speedup: 1.0 is perfect scaling.",
    "replica_sync/max_abs_diff": "Largest absolute difference between any replica's copy of a variable and replica 0's. 0 means every replica holds the same values (in sync); above 0, they diverged.",
    "replica_sync/diverged_variables": "Variables whose copies differ between replicas. 0 means every replica holds the same values (in sync); above 0, that many diverged (the log says which and why).",
    "throughput/setup": "The run's set-up: strategy, workers, replicas, batch sizes.",
    "throughput/setup_baseline": "What the speedup is measured against, and what it means.",
    "throughput/setup_measuring": "How throughput is measured: how often, what is left out.",
    "throughput/advice": "Advice from the run's figures, each given once.",
    "scaling/table": "keras-scaling bench: the sweep's speedup and efficiency.",
    "scaling/speedup_vs_replicas": "keras-scaling bench: speedup against replicas, and the ideal.",
    "scaling/efficiency_vs_per_replica_batch": "keras-scaling bench: efficiency against batch.",
}

_lock = threading.RLock()  # reentrant: a SIGTERM handler may end a fit, and close its file
_files: dict[str, "_EventFile"] = {}  # absolute run directory: this process's open file
_numbers = itertools.count()  # names a process's files in the order written


def run_dir(log_dir, run=RUN):
    """`log_dir/run`, the run directory of keras_scaling's summaries (`log_dir/scaling`)."""
    return os.path.join(os.fspath(log_dir), run)


def check_log_dir(log_dir, parameter="log_dir", run=RUN, make=True):
    """Creates `log_dir/run` (unless `make=False`) and checks it can be written; returns the absolute `log_dir`.

    Raises `TypeError` for a `log_dir` not a path, `ValueError` naming `parameter` when unwritable.
    """
    if not isinstance(log_dir, (str, os.PathLike)):
        raise TypeError(
            f"{parameter} must be a path (str or os.PathLike), got {type(log_dir).__name__}"
        )
    log_dir = os.path.abspath(os.fspath(log_dir))
    existing = run_dir(log_dir, run)
    try:
        if make:
            os.makedirs(existing, exist_ok=True)
        while not os.path.exists(existing):  # the nearest parent there must be writable
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    except OSError as error:
        raise ValueError(
            f"{parameter}={log_dir!r} cannot be created ({error.strerror}); pass a directory you can write to"
        ) from None
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"{parameter}={log_dir!r} is not writable; pass a directory you can write to"
        )
    return log_dir


def check_log_dir_can_be_made(log_dir, parameter="log_dir", run=RUN):
    """`check_log_dir` without creating anything (the first write creates it)."""
    return check_log_dir(log_dir, parameter, run, make=False)


def write_scalars(log_dir, step, scalars, run=RUN):
    """Writes `{tag: number}` at `step` to `log_dir/run` as one event (float32 tensors)."""
    values = [
        (tag, _tensor(types_pb2.DT_FLOAT, float_val=[float(value)]))
        for tag, value in scalars.items()
    ]
    _write(log_dir, run, step, values, scalar_metadata.create_summary_metadata)


def write_text(log_dir, step, tag, markdown, run=RUN):
    """Writes a Markdown text summary."""
    tensor = _tensor(types_pb2.DT_STRING, [], string_val=[markdown.encode("utf-8")])
    _write(log_dir, run, step, [(tag, tensor)], text_metadata.create_summary_metadata)


def write_image(log_dir, step, tag, png_bytes, run=RUN):
    """Writes one PNG image (its encoded bytes); `ValueError` if it is not a PNG."""
    if not isinstance(png_bytes, (bytes, bytearray)) or png_bytes[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(
            f"png_bytes must be the bytes of a PNG file, got {type(png_bytes).__name__} starting {bytes(png_bytes[:8])!r}"
        )
    width, height = struct.unpack(">II", png_bytes[16:24])  # from the IHDR chunk
    strings = [str(width).encode(), str(height).encode(), bytes(png_bytes)]
    tensor = _tensor(types_pb2.DT_STRING, [3], string_val=strings)
    _write(log_dir, run, step, [(tag, tensor)], image_metadata.create_summary_metadata)


def write_custom_scalars_layout(log_dir, layout, run=RUN):
    """Writes a Custom Scalars dashboard layout (a `layout_pb2.Layout`) at step 0."""
    tensor = _tensor(types_pb2.DT_STRING, [], string_val=[layout.SerializeToString()])
    values = [(custom_scalar_metadata.CONFIG_SUMMARY_TAG, tensor)]
    _write(log_dir, run, 0, values, lambda **_: custom_scalar_metadata.create_summary_metadata())


def _tensor(dtype, shape=None, **values):
    dims = None if shape is None else [tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in shape]
    shape_proto = None if dims is None else tensor_shape_pb2.TensorShapeProto(dim=dims)
    return tensor_pb2.TensorProto(dtype=dtype, tensor_shape=shape_proto, **values)


def close(log_dir, run=RUN):
    """Closes this process's event file of `log_dir/run`; a later write opens a new one."""
    with _lock:
        if (event_file := _files.pop(_key(log_dir, run), None)) is not None:
            event_file.close()


def close_all():
    """Closes every event file this process has open (also run at exit)."""
    for key in list(_files):
        close(key, run="")


def open_event_files():
    """The run directories in which this process has an event file open."""
    return list(_files)


def _key(log_dir, run):
    return os.path.abspath(run_dir(log_dir, run))


def _write(log_dir, run, step, values, create_metadata):
    """Writes `[(tag, TensorProto)]` as one event; a tag's first in the file carries its metadata."""
    key = _key(log_dir, run)
    with _lock:
        event_file = _files.get(key) or _files.setdefault(key, _EventFile(key))
        summary = summary_pb2.Summary()
        for tag, tensor in values:
            value = summary.value.add(tag=tag, tensor=tensor)
            if tag not in event_file.described:
                value.metadata.CopyFrom(
                    create_metadata(display_name=None, description=TAG_DESCRIPTIONS.get(tag))
                )
                event_file.described.add(tag)
        try:
            event_file.write(
                event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)
            )
        except OSError:
            _files.pop(key, None)  # closed by the failed write: a later write starts another
            raise


class _EventFile:
    """A run directory's new event file: TensorBoard's `RecordWriter`, flushed at each event.

    Written on the caller's thread. TensorBoard's `EventFileWriter` hands each
    event to a thread of its own, whose wake-ups cost a short `fit` 3 to 4%
    (`benchmarks/throughput_overhead.py`); a flushed record is one system call.
    """

    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        self.described = set()
        name = f"events.out.tfevents.{time.time():010.0f}.{socket.gethostname()}.{os.getpid()}"
        self.path = os.path.join(directory, f"{name}.{next(_numbers)}")
        self.records = RecordWriter(open(self.path, "wb"))
        source = event_pb2.SourceMetadata(writer="tensorboard.summary.writer.record_writer")
        header = dict(file_version="brain.Event:2", source_metadata=source)
        self.write(event_pb2.Event(wall_time=time.time(), **header))

    def write(self, event):
        """Writes and flushes `event`; a failed write (a full disk) closes the file, which may end in a torn record."""
        try:
            self.records.write(event.SerializeToString())
            self.records.flush()
        except OSError as error:
            with contextlib.suppress(OSError):
                self.records.close()
            raise self._error(error) from error

    def close(self):
        try:
            self.records.close()
        except OSError as error:
            raise self._error(error) from error

    def _error(self, error):
        return OSError(
            error.errno, f"Could not write the event file {self.path} ({error.strerror})"
        )


# `value`: a float (scalars), str (text) or bytes (image, layout).
Point = collections.namedtuple("Point", "step value plugin")


def read_summaries(run_dir):
    """Every summary point of one run directory, none purged: `{tag: [Point]}` in the order written."""
    points: dict[str, list[Point]] = {}
    plugin_of: dict[str, str] = {}  # a tag's metadata comes with its first point in a file
    paths = glob.glob(os.path.join(os.fspath(run_dir), "events.out.tfevents.*"))
    for path in sorted(paths, key=_order):
        for event in event_file_loader.EventFileLoader(path).Load():
            for value in event.summary.value if event.HasField("summary") else ():
                if value.HasField("metadata"):
                    plugin_of[value.tag] = value.metadata.plugin_data.plugin_name
                plugin = plugin_of.get(value.tag, "")
                content = _value_content(value, plugin)
                if content is not None:
                    point = Point(int(event.step), content, plugin or "scalars")
                    points.setdefault(value.tag, []).append(point)
    return points


def _order(path):
    """Files in the order written: by the time, then the number that end their names."""
    fields = os.path.basename(path).split(".")
    return [int(field) if field.isdigit() else -1 for field in (fields[3], fields[-1])], path


def _value_content(value, plugin):
    if value.tensor.dtype in _NUMBER_DTYPES:
        array = tensor_util.make_ndarray(value.tensor)
        return float(array.reshape(())) if array.size == 1 else None
    strings = value.tensor.string_val
    index = {"images": 2, "text": 0, "custom_scalars": 0}.get(plugin)
    if index is None or len(strings) != (3 if plugin == "images" else 1):
        return None
    return strings[index].decode("utf-8") if plugin == "text" else strings[index]


_NUMBER_DTYPES = (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE, types_pb2.DT_INT32, types_pb2.DT_INT64)


def read_scalars(run_dir):
    """Every scalar point of one run directory: `{tag: [(step, value)]}` (see `read_summaries`)."""
    return {
        tag: [(point.step, point.value) for point in points]
        for tag, points in read_summaries(run_dir).items()
        if isinstance(points[0].value, float)
    }


def last_step_written(log_dir, tags, run=RUN):
    """The largest step at which any of `tags` was written in `log_dir/run`, or -1."""
    scalars = read_scalars(run_dir(log_dir, run))
    return max((step for tag in tags for step, _ in scalars.get(tag, ())), default=-1)


atexit.register(close_all)
