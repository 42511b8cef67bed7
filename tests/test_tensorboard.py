"""keras_scaling's TensorBoard output: one event file per run directory, read back.

The unmarked tests write and read real event files. The live tests start the
real `tensorboard` server before training on 2 logical CPUs with
`ReplicaSyncCheck`, `ThroughputLogger` and `keras.callbacks.TensorBoard` into
one log directory, and read every tag back over the server's HTTP data API.
"""

import io
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

from keras_scaling.summaries import _tensorboard

_SERVER_START_TIMEOUT_S = 90
_SERVER_CATCH_UP_TIMEOUT_S = 90
_HTTP_TIMEOUT_S = 10


def _png(width=30, height=20):
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (31, 119, 180)).save(buffer, format="PNG")
    return buffer.getvalue()


def _layout():
    from tensorboard.plugins.custom_scalar import layout_pb2

    return layout_pb2.Layout(category=[layout_pb2.Category(title="scaling")])


def _event_files(directory):
    return sorted(name for name in os.listdir(directory) if name.startswith("events.out.tfevents."))


def test_run_dir_is_scaling_beside_the_train_directory_of_keras(tmp_path):
    assert _tensorboard.run_dir(tmp_path) == os.path.join(tmp_path, "scaling")
    assert _tensorboard.run_dir(tmp_path, run="summary") == os.path.join(tmp_path, "summary")


def test_scalars_text_image_and_layout_share_one_event_file(tmp_path):
    log_dir = tmp_path / "logs"
    _tensorboard.write_custom_scalars_layout(log_dir, _layout())
    _tensorboard.write_text(log_dir, 0, "throughput/setup", "| a | b |")
    _tensorboard.write_scalars(log_dir, 1, {"throughput/samples_per_sec": 10.0})
    _tensorboard.write_scalars(log_dir, 2, {"throughput/samples_per_sec": 20.0})
    _tensorboard.write_image(log_dir, 0, "scaling/speedup_vs_replicas", _png())

    assert os.listdir(log_dir) == ["scaling"]
    assert len(_event_files(log_dir / "scaling")) == 1


def test_every_summary_reads_back_as_written(tmp_path):
    png = _png()
    _tensorboard.write_custom_scalars_layout(tmp_path, _layout())
    _tensorboard.write_text(tmp_path, 3, "throughput/setup", "| strategy | Mirrored |")
    _tensorboard.write_image(tmp_path, 0, "scaling/speedup_vs_replicas", png)
    _tensorboard.write_scalars(tmp_path, 5, {"scaling/speedup": 1.5})

    summaries = _tensorboard.read_summaries(_tensorboard.run_dir(tmp_path))

    assert [(p.step, p.value, p.plugin) for p in summaries["throughput/setup"]] == [
        (3, "| strategy | Mirrored |", "text")
    ]
    assert [(p.step, p.value, p.plugin) for p in summaries["scaling/speedup_vs_replicas"]] == [
        (0, png, "images")
    ]
    assert [(p.step, p.value, p.plugin) for p in summaries["scaling/speedup"]] == [
        (5, 1.5, "scalars")
    ]
    (layout,) = summaries["custom_scalars__config__"]
    assert layout.plugin == "custom_scalars"
    assert layout.value == _layout().SerializeToString()
    assert _tensorboard.read_scalars(_tensorboard.run_dir(tmp_path)) == {
        "scaling/speedup": [(5, 1.5)]
    }


def _protobuf_scalar_event(wall_time, step, scalars, described):
    """The event `write_scalars` writes, built with protobuf's own classes."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
    from tensorboard.plugins.scalar import metadata

    values = []
    for tag, number in scalars.items():
        value = summary_pb2.Summary.Value(
            tag=tag, tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[number])
        )
        if tag in described:
            value.metadata.CopyFrom(
                metadata.create_summary_metadata(
                    display_name=None, description=_tensorboard.TAG_DESCRIPTIONS.get(tag)
                )
            )
        values.append(value)
    return event_pb2.Event(
        wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=values)
    )


def test_scalar_events_are_the_events_protobuf_builds(tmp_path):
    from tensorboard.compat.proto import event_pb2

    first = {"throughput/samples_per_sec": 1234.5, "scaling/speedup": 1.75, "my/tag": -0.25}
    later = {"throughput/samples_per_sec": 3.0e39, "scaling/speedup": float("nan"), "é/tag": 2.0}
    _tensorboard.write_scalars(tmp_path, 7, first)
    _tensorboard.write_scalars(tmp_path, 300, later)
    _tensorboard.write_scalars(tmp_path, 2**40 + 3, {"my/tag": 1.0})

    header, *events = _records(_tensorboard.run_dir(tmp_path))
    parsed = [event_pb2.Event.FromString(record) for record in events]
    expected = [
        _protobuf_scalar_event(parsed[0].wall_time, 7, first, described=set(first)),
        _protobuf_scalar_event(parsed[1].wall_time, 300, later, described={"é/tag"}),
        _protobuf_scalar_event(parsed[2].wall_time, 2**40 + 3, {"my/tag": 1.0}, described=()),
    ]
    assert events == [event.SerializeToString() for event in expected]
    assert parsed[1].summary.value[0].tensor.float_val[0] == float("inf")
    assert abs(time.time() - parsed[0].wall_time) < 60


# Writes a summary of every kind; run as a script, also says whether
# TensorFlow got loaded.
_WRITE_EVERY_KIND = """
import sys

from tensorboard.plugins.custom_scalar import layout_pb2

from keras_scaling.summaries import _tensorboard


def write(log_dir, png):
    layout = layout_pb2.Layout(category=[layout_pb2.Category(title="scaling")])
    _tensorboard.write_custom_scalars_layout(log_dir, layout)
    _tensorboard.write_text(log_dir, 3, "throughput/setup", "| strategy | Mirrored |")
    _tensorboard.write_image(log_dir, 0, "scaling/speedup_vs_replicas", png)
    _tensorboard.write_scalars(log_dir, 5, {"scaling/speedup": 1.5})


if __name__ == "__main__":
    write(sys.argv[1], open(sys.argv[2], "rb").read())
    print("tensorflow" in sys.modules)
"""


def _records(run_dir, name=None):
    """The records of event file `name` (default: the one in `run_dir`), read by TensorFlow, which checks checksums."""
    import tensorflow as tf

    if name is None:
        (name,) = _event_files(run_dir)
    return [record.numpy() for record in tf.data.TFRecordDataset(os.path.join(run_dir, name))]


def _without_wall_time(record):
    from tensorboard.compat.proto import event_pb2

    event = event_pb2.Event.FromString(record)
    event.wall_time = 0
    return event.SerializeToString()


def test_a_process_without_tensorflow_writes_the_same_events_without_loading_it(tmp_path):
    import tensorflow as tf  # noqa: F401 - this process has TensorFlow loaded, the other not

    png = _png()
    (tmp_path / "plot.png").write_bytes(png)
    (tmp_path / "write.py").write_text(_WRITE_EVERY_KIND)
    result = subprocess.run(
        [sys.executable, "write.py", "without_tensorflow", "plot.png"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "False", "the writing process loaded TensorFlow"
    namespace = {"__name__": "write"}
    exec(compile(_WRITE_EVERY_KIND, "write.py", "exec"), namespace)
    namespace["write"](tmp_path / "with_tensorflow", png)

    without = _records(_tensorboard.run_dir(tmp_path / "without_tensorflow"))
    with_tensorflow = _records(_tensorboard.run_dir(tmp_path / "with_tensorflow"))
    # The file version, the layout, the text, the image and the scalar.
    assert len(without) == 5
    assert [_without_wall_time(r) for r in without] == [
        _without_wall_time(r) for r in with_tensorflow
    ]


def test_an_image_is_served_with_its_width_and_height(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    _tensorboard.write_image(tmp_path, 0, "scaling/speedup_vs_replicas", _png(30, 20))
    accumulator = event_accumulator.EventAccumulator(
        _tensorboard.run_dir(tmp_path), size_guidance={event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()

    (event,) = accumulator.Tensors("scaling/speedup_vs_replicas")
    assert list(event.tensor_proto.string_val[:2]) == [b"30", b"20"]


def test_a_tag_carries_its_description_on_its_first_event_only(tmp_path):
    from tensorboard.backend.event_processing import event_file_loader

    for step in (1, 2):
        _tensorboard.write_scalars(tmp_path, step, {"replica_sync/max_abs_diff": 0.0})
    (name,) = _event_files(_tensorboard.run_dir(tmp_path))
    path = os.path.join(_tensorboard.run_dir(tmp_path), name)

    descriptions = [
        value.metadata.summary_description
        for event in event_file_loader.EventFileLoader(path).Load()
        if event.HasField("summary")
        for value in event.summary.value
    ]
    assert descriptions[1] == ""
    assert "0 means every replica holds the same values (in sync)" in descriptions[0]


def test_every_scalar_tag_the_callbacks_write_has_a_description():
    from keras_scaling.replica_sync import replica_sync_check as replica_sync
    from keras_scaling.throughput import _dashboard

    tags = set(replica_sync._SCALAR_TAGS) | set(_dashboard.SCALAR_TAGS)

    assert tags - set(_tensorboard.TAG_DESCRIPTIONS) == set()


def test_replica_sync_descriptions_say_what_zero_and_non_zero_mean():
    for tag in ("replica_sync/max_abs_diff", "replica_sync/diverged_variables"):
        description = _tensorboard.TAG_DESCRIPTIONS[tag]
        assert "0 means" in description and "in sync" in description
        assert "above 0" in description and "diverged" in description


def test_every_point_is_whole_in_the_file_when_its_write_returns(tmp_path):
    import tensorflow  # noqa: F401 - a training process's writer

    log_dir = tmp_path / "logs"
    run_dir = _tensorboard.run_dir(log_dir)
    try:
        for step in (1, 2):
            _tensorboard.write_scalars(log_dir, step, {"throughput/samples_per_sec": float(step)})
            # Neither a flush nor a close: what TensorBoard, watching, reads now.
            scalars = _tensorboard.read_scalars(run_dir)
            expected = [(s, float(s)) for s in range(1, step + 1)]
            assert scalars["throughput/samples_per_sec"] == expected
        assert len(_records(run_dir)) == 3
    finally:
        _tensorboard.close(log_dir)


def test_last_step_written_is_the_largest_step_of_the_given_tags(tmp_path):
    _tensorboard.write_scalars(tmp_path, 4, {"throughput/samples_per_sec": 1.0})
    _tensorboard.write_scalars(tmp_path, 9, {"replica_sync/max_abs_diff": 0.0})

    assert _tensorboard.last_step_written(tmp_path, {"throughput/samples_per_sec"}) == 4
    assert _tensorboard.last_step_written(tmp_path, {"scaling/speedup"}) == -1


def test_last_step_written_counts_the_open_file_and_the_files_of_earlier_runs(tmp_path):
    _tensorboard.write_scalars(tmp_path, 12, {"throughput/samples_per_sec": 1.0})
    _tensorboard.close(tmp_path)  # as an earlier run leaves its file
    tags = {"throughput/samples_per_sec"}

    _tensorboard.write_scalars(tmp_path, 4, {"throughput/samples_per_sec": 1.0})
    assert _tensorboard.last_step_written(tmp_path, tags) == 12
    _tensorboard.write_scalars(tmp_path, 15, {"throughput/samples_per_sec": 1.0})
    assert _tensorboard.last_step_written(tmp_path, tags) == 15  # the file still open


def test_a_log_dir_is_checked_without_being_made_then_made(tmp_path):
    log_dir = tmp_path / "new" / "logs"

    assert _tensorboard.check_log_dir_can_be_made(log_dir) == str(log_dir)
    assert not (tmp_path / "new").exists()
    assert _tensorboard.check_log_dir(log_dir) == str(log_dir)
    assert os.path.isdir(_tensorboard.run_dir(log_dir))


def test_a_log_dir_under_a_file_is_refused_before_anything_is_made(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"log_dir=.*cannot be created \(Not a directory\)"):
        _tensorboard.check_log_dir_can_be_made(blocker / "logs")
    with pytest.raises(TypeError, match="log_dir must be a path"):
        _tensorboard.check_log_dir_can_be_made(3)


def test_bytes_that_are_not_a_png_are_refused_naming_the_parameter(tmp_path):
    with pytest.raises(ValueError, match="png_bytes must be the bytes of a PNG file"):
        _tensorboard.write_image(tmp_path, 0, "scaling/speedup_vs_replicas", b"GIF89a")


# A live TensorBoard, started before training.


class _TensorBoard:
    """The real `tensorboard` server on 127.0.0.1, reloading every second."""

    def __init__(self, log_dir, load_fast, output_path):
        from keras_scaling.launch import launcher

        (self.port,) = launcher.free_ports(1)
        self.load_fast = load_fast
        self._output = open(output_path, "w")
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                str(log_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                f"--load_fast={load_fast}",
                "--reload_interval",
                "1",
            ],
            stdout=self._output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.output_path = output_path

    def get(self, path, **query):
        url = f"http://127.0.0.1:{self.port}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S) as response:
            return json.load(response)

    def wait_until_serving(self):
        deadline = time.monotonic() + _SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                self.get("/data/environment")
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        pytest.fail(
            f"tensorboard --load_fast={self.load_fast} did not serve within "
            f"{_SERVER_START_TIMEOUT_S} s; its output ({self.output_path}):\n"
            + open(self.output_path).read()[-3000:]
        )

    def stop(self):
        from keras_scaling.cli.bench import _stop

        _stop(self._process)
        self._output.close()


def _served_points(server):
    """`{(run, tag): [(step, value)]}` of every scalar the server serves."""
    served = {}
    for run, tags in server.get("/data/plugin/scalars/tags").items():
        for tag in tags:
            rows = server.get("/data/plugin/scalars/scalars", run=run, tag=tag)
            served[(run, tag)] = [(int(step), float(value)) for _, step, value in rows]
    return served


def _written_points(log_dir):
    """`{(run, tag): [(step, value)]}` of the event files under `log_dir`."""
    written = {}
    for run in ("train", "validation", "scaling"):
        for tag, points in _tensorboard.read_scalars(os.path.join(log_dir, run)).items():
            written[(run, tag)] = points
    return written


def _as_float32(points):
    # The server sends float32 values widened to float64, as the files hold them.
    return [(step, float(np.float32(value))) for step, value in points]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Two servers watching one log directory while a model trains into it."""
    import keras
    import tensorflow as tf

    import keras_scaling

    root = tmp_path_factory.mktemp("live")
    log_dir = root / "logs"
    log_dir.mkdir()
    servers = [
        _TensorBoard(log_dir, load_fast, root / f"tensorboard_{load_fast}.log")
        for load_fast in ("false", "auto")
    ]
    try:
        for server in servers:
            server.wait_until_serving()
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input((16,)),
                    keras.layers.Dense(64, activation="relu"),
                    keras.layers.Dense(1),
                ]
            )
            model.compile(optimizer="adam", loss="mse")
        rng = np.random.default_rng(0)
        # 96 steps: several points of every tag, each callback's at its own steps.
        x = rng.normal(size=(1024, 16)).astype("float32")
        dataset = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True)))
        model.fit(
            dataset.batch(32, drop_remainder=True),
            epochs=3,
            verbose=0,
            callbacks=[
                keras_scaling.ReplicaSyncCheck(every_n_steps=20, log_dir=str(log_dir)),
                keras_scaling.ThroughputLogger(
                    str(log_dir), baseline=1000.0, update_freq=8, warmup_steps=2
                ),
                keras.callbacks.TensorBoard(str(log_dir), update_freq=16),
            ],
        )
        written = _written_points(log_dir)
        yield servers, written, log_dir
    finally:
        for server in servers:
            server.stop()


def _wait_until_served(server, written):
    """What the server serves once it holds every written point, or after the timeout."""
    deadline = time.monotonic() + _SERVER_CATCH_UP_TIMEOUT_S
    while True:
        served = _served_points(server)
        if (
            all(
                _as_float32(served.get(key, [])) == _as_float32(points)
                for key, points in written.items()
            )
            or time.monotonic() > deadline
        ):
            return served
        time.sleep(1)


@pytest.mark.logical_cpus(2)
def test_the_training_wrote_keras_and_keras_scaling_tags_to_separate_runs(live):
    _, written, log_dir = live

    runs_of = {tag: run for run, tag in written}
    assert runs_of["epoch_loss"] == "train"
    assert runs_of["throughput/samples_per_sec"] == "scaling"
    assert runs_of["scaling/speedup"] == "scaling"
    assert runs_of["replica_sync/max_abs_diff"] == "scaling"
    assert len(_event_files(log_dir / "scaling")) == 1


@pytest.mark.logical_cpus(2)
@pytest.mark.parametrize("load_fast", ["false", "auto"])
def test_a_tensorboard_watching_the_run_serves_every_point_written(live, load_fast):
    servers, written, _ = live
    (server,) = [server for server in servers if server.load_fast == load_fast]

    served = _wait_until_served(server, written)

    missing = sorted(set(written) - set(served))
    assert not missing, f"tensorboard --load_fast={load_fast} does not serve {missing}"
    for key, points in written.items():
        last_served = served[key][-1] if served[key] else None
        assert _as_float32(served[key]) == _as_float32(points), (
            f"{key}: tensorboard --load_fast={load_fast} serves {len(served[key])} "
            f"points up to {last_served}, the event files hold {len(points)} up to "
            f"{points[-1]}"
        )


@pytest.mark.logical_cpus(2)
def test_a_tensorboard_serves_the_speedup_at_the_steps_and_values_written(live):
    servers, written, _ = live
    (server,) = [server for server in servers if server.load_fast == "false"]
    expected = written[("scaling", "scaling/speedup")]
    assert expected

    served = _wait_until_served(server, written)[("scaling", "scaling/speedup")]

    assert [step for step, _ in served] == [step for step, _ in expected]
    for (_, value), (_, expected_value) in zip(served, expected):
        assert value == pytest.approx(expected_value, rel=1e-6)


@pytest.mark.logical_cpus(2)
def test_tensorboard_shows_what_zero_means_beside_replica_sync_charts(live):
    servers, _, _ = live
    tags = servers[0].get("/data/plugin/scalars/tags")["scaling"]

    for tag in ("replica_sync/max_abs_diff", "replica_sync/diverged_variables"):
        assert "in sync" in tags[tag]["description"], tags[tag]


_WRITE_FROM_A_THREAD = """
import sys
import threading

import tensorflow  # noqa: F401 - the writer a training process uses
from tensorboard.plugins.custom_scalar import layout_pb2

from keras_scaling.summaries import _tensorboard

before = {name for name in sys.modules if name.startswith("tensorboard")}
thread = threading.Thread(
    target=lambda: (
        _tensorboard.write_scalars("logs", 1, {"throughput/samples_per_sec": 1.0}),
        _tensorboard.write_text("logs", 1, "advice", "text"),
        _tensorboard.write_custom_scalars_layout("logs", layout_pb2.Layout()),
        _tensorboard.close_all(),
    )
)
thread.start()
thread.join()
after = {name for name in sys.modules if name.startswith("tensorboard")}
print(sorted(after - before))
"""


def test_writing_from_another_thread_imports_no_tensorboard_module(tmp_path):
    # A thread that imported TensorBoard's writer while fit's thread imported
    # TensorBoard's TensorFlow stub saw a partly initialised module (a
    # circular-import AttributeError, once in a full test run): every module
    # a write needs is imported with keras_scaling's writer itself.
    (tmp_path / "write.py").write_text(_WRITE_FROM_A_THREAD)
    result = subprocess.run(
        [sys.executable, "write.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"
    assert _tensorboard.read_scalars(tmp_path / "logs" / "scaling")


# Writes points under a file size limit until one fails, then writes one more
# without it; prints the error's errno and message.
_WRITE_PAST_A_SIZE_LIMIT = """
import json, resource, signal, sys

from keras_scaling.summaries import _tensorboard

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (700, hard))
log_dir, error = sys.argv[1], None
for step in range(1, 100):
    try:
        _tensorboard.write_scalars(log_dir, step, {"throughput/samples_per_sec": float(step)})
    except OSError as caught:
        error = caught
        break
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
_tensorboard.write_scalars(log_dir, 1000, {"throughput/samples_per_sec": 1000.0})
_tensorboard.close(log_dir)
print(json.dumps({"errno": error.errno, "message": str(error), "failed_step": step}))
"""


def test_a_failed_write_names_the_file_and_a_later_write_starts_a_whole_one(tmp_path):
    import errno

    (tmp_path / "write.py").write_text(_WRITE_PAST_A_SIZE_LIMIT)
    result = subprocess.run(
        [sys.executable, "write.py", str(tmp_path / "logs")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    run_dir = _tensorboard.run_dir(tmp_path / "logs")
    first, second = sorted(_event_files(run_dir), key=lambda name: int(name.split(".")[-1]))

    assert report["errno"] == errno.EFBIG
    assert os.path.join(run_dir, first) in report["message"]
    # The failed point is not in the file; every point before it is, then the later one.
    points = _tensorboard.read_scalars(run_dir)["throughput/samples_per_sec"]
    assert points == [(s, float(s)) for s in range(1, report["failed_step"])] + [(1000, 1000.0)]
    assert len(_records(run_dir, second)) == 2
