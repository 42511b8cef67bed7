"""The event file of `log_dir/scaling`: one per process, closed when the fit ends.

Records are read back with TensorBoard's own reader (`event_file_loader`,
which checks every record's checksums) and with TensorFlow's TFRecord
reader; open handles are read from `/proc/self/fd`. The fits run on a real
MirroredStrategy over 2 logical CPUs, so that `ReplicaSyncCheck` writes
into the file `ThroughputLogger` writes.
"""

import os
import threading

import numpy as np
import pytest

from keras_scaling.summaries import _tensorboard


def _open_handles_under(directory):
    """The files under `directory` this process has open now."""
    directory = os.path.realpath(directory)
    handles = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed while listing
            continue
        if target.startswith(directory + os.sep):
            handles.append(target)
    return handles


def _records_checked_by_tensorflow(run_dir):
    import tensorflow as tf

    count = 0
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("events.out.tfevents."):
            # Raises DataLossError on a torn or interleaved record.
            count += sum(1 for _ in tf.data.TFRecordDataset(os.path.join(run_dir, name)))
    return count


def test_threads_writing_with_a_concurrent_close_lose_no_record(tmp_path):
    num_threads, writes_per_thread = 3, 300
    stop_closing = threading.Event()
    closes = [0]

    def write(thread_index):
        for step in range(writes_per_thread):
            _tensorboard.write_scalars(tmp_path, step, {f"stress/thread_{thread_index}": step})

    def keep_closing():  # as a SIGTERM handler ending a fit may
        while not stop_closing.wait(0.001):
            _tensorboard.close(tmp_path)
            closes[0] += 1

    closer = threading.Thread(target=keep_closing)
    writers = [threading.Thread(target=write, args=(i,)) for i in range(num_threads)]
    closer.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join(timeout=120)
    stop_closing.set()
    closer.join(timeout=120)
    _tensorboard.close(tmp_path)

    scalars = _tensorboard.read_scalars(_tensorboard.run_dir(tmp_path))
    for i in range(num_threads):
        expected = [(step, float(step)) for step in range(writes_per_thread)]
        assert scalars[f"stress/thread_{i}"] == expected
    # Each file's version event, then one event per write, every record whole.
    run_dir = _tensorboard.run_dir(tmp_path)
    files = [name for name in os.listdir(run_dir) if name.startswith("events.out.tfevents.")]
    assert len(files) > 1 and closes[0] > 0
    assert _records_checked_by_tensorflow(run_dir) == len(files) + num_threads * writes_per_thread


def test_close_closes_the_file_and_a_later_write_opens_another(tmp_path):
    _tensorboard.write_scalars(tmp_path, 1, {"throughput/samples_per_sec": 1.0})
    _tensorboard.write_scalars(tmp_path, 2, {"replica_sync/max_abs_diff": 0.0})
    assert len(_open_handles_under(tmp_path)) == 1  # one file for both tags

    _tensorboard.close(tmp_path)
    assert _open_handles_under(tmp_path) == []
    _tensorboard.write_scalars(tmp_path, 3, {"throughput/samples_per_sec": 3.0})
    _tensorboard.close(tmp_path)

    assert len(os.listdir(_tensorboard.run_dir(tmp_path))) == 2
    assert _tensorboard.read_scalars(_tensorboard.run_dir(tmp_path)) == {
        "throughput/samples_per_sec": [(1, 1.0), (3, 3.0)],
        "replica_sync/max_abs_diff": [(2, 0.0)],
    }


def test_close_all_closes_the_files_written_without_a_hold(tmp_path):
    # As at the exit of a process that wrote without a fit (keras-scaling bench).
    _tensorboard.write_text(tmp_path, 0, "scaling/table", "| a |")
    assert len(_open_handles_under(tmp_path)) == 1

    _tensorboard.close_all()

    assert _open_handles_under(tmp_path) == []
    assert _tensorboard.read_summaries(_tensorboard.run_dir(tmp_path))["scaling/table"][
        0
    ].value == ("| a |")


# On 2 logical CPUs, with both callbacks.


@pytest.fixture(scope="module")
def strategy():
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _model(strategy):
    import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    return model


def _data(num_samples=256):
    x = np.random.default_rng(0).normal(size=(num_samples, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def _both_callbacks(log_dir, every_step=False):
    import keras_scaling

    return [
        keras_scaling.ReplicaSyncCheck(every_n_steps=1 if every_step else 100, log_dir=log_dir),
        keras_scaling.ThroughputLogger(
            log_dir,
            baseline=1000.0,
            update_freq=1 if every_step else "auto",
            warmup_steps=0 if every_step else None,
        ),
    ]


@pytest.mark.logical_cpus(2)
def test_both_callbacks_writing_at_every_step_are_read_whole_while_fit_runs(strategy, tmp_path):
    log_dir = str(tmp_path)
    run_dir = _tensorboard.run_dir(log_dir)
    model = _model(strategy)
    stop_reading = threading.Event()
    seen = []

    def keep_reading():  # as TensorBoard, watching the run
        while not stop_reading.wait(0.01):
            seen.append(_tensorboard.read_scalars(run_dir).get("replica_sync/max_abs_diff", []))

    reader = threading.Thread(target=keep_reading)
    reader.start()
    try:
        model.fit(
            *_data(), batch_size=16, epochs=2, verbose=0, callbacks=_both_callbacks(log_dir, True)
        )
    finally:
        stop_reading.set()
        reader.join(timeout=120)

    steps = int(model.optimizer.iterations.numpy())
    scalars = _tensorboard.read_scalars(run_dir)
    # A check at the start (step 0) and after every step, each written once.
    written = scalars["replica_sync/max_abs_diff"]
    assert [step for step, _ in written] == list(range(steps + 1))
    # Read while fit ran: always the first points written, in order.
    assert any(0 < len(points) < len(written) for points in seen)
    assert all(points == written[: len(points)] for points in seen)
    assert {value for _, value in scalars["replica_sync/diverged_variables"]} == {0.0}
    throughput_steps = [step for step, _ in scalars["throughput/samples_per_sec"]]
    assert len(throughput_steps) >= steps - 4
    assert throughput_steps == sorted(set(throughput_steps))
    assert _open_handles_under(log_dir) == []
    assert _records_checked_by_tensorflow(run_dir) >= (1 + (steps + 1) + len(throughput_steps))


@pytest.mark.logical_cpus(2)
def test_the_event_file_is_open_during_fit_and_closed_when_it_returns(strategy, tmp_path):
    import keras

    log_dir = str(tmp_path)
    handles_during_fit = []

    class NoteHandles(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            handles_during_fit.append(len(_open_handles_under(log_dir)))

    _model(strategy).fit(
        *_data(), batch_size=16, verbose=0, callbacks=[*_both_callbacks(log_dir), NoteHandles()]
    )

    assert handles_during_fit == [1]
    assert _open_handles_under(log_dir) == []
    assert "replica_sync/max_abs_diff" in _tensorboard.read_scalars(_tensorboard.run_dir(log_dir))


@pytest.mark.logical_cpus(2)
def test_no_event_file_handle_is_left_after_many_fits(strategy, tmp_path):
    log_dir = str(tmp_path)
    model = _model(strategy)
    for _ in range(6):
        model.fit(*_data(64), batch_size=16, verbose=0, callbacks=_both_callbacks(log_dir))
        assert _open_handles_under(log_dir) == []
    assert _tensorboard.open_event_files() == []


@pytest.mark.logical_cpus(2)
def test_the_event_file_is_closed_when_a_divergence_stops_the_fit(strategy, tmp_path):
    import keras_scaling

    log_dir = str(tmp_path)
    model = _model(strategy)
    bias = model.layers[0].bias
    bias.value.values[1].assign(np.ones(8, "float32"))

    with pytest.raises(keras_scaling.ReplicaDivergenceError):
        model.fit(*_data(), batch_size=16, verbose=0, callbacks=_both_callbacks(log_dir))

    assert _open_handles_under(log_dir) == []
    points = _tensorboard.read_scalars(_tensorboard.run_dir(log_dir))[
        "replica_sync/diverged_variables"
    ]
    assert points == [(0, 1.0)]


@pytest.mark.logical_cpus(2)
def test_the_event_file_is_closed_when_a_step_raises(strategy, tmp_path):
    import keras
    import tensorflow as tf

    class RaisesOnNaN(keras.layers.Layer):
        def call(self, inputs):
            return tf.debugging.assert_all_finite(inputs, "a NaN in the batch")

    log_dir = str(tmp_path)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), RaisesOnNaN(), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    x, y = _data()
    x[100] = np.nan  # in the seventh batch

    with pytest.raises(tf.errors.InvalidArgumentError, match="a NaN in the batch"):
        model.fit(x, y, batch_size=16, shuffle=False, verbose=0, callbacks=_both_callbacks(log_dir))

    assert _open_handles_under(log_dir) == []
