"""ThroughputLogger's writer: points through TensorBoard's writer, throughput.json at once."""

import os
import threading
import time

import pytest
import tensorflow  # noqa: F401 - loaded in a training process: the writer is TensorBoard's

from keras_scaling.summaries import _tensorboard
from keras_scaling.throughput import _run_record, _writer
from keras_scaling.throughput._writer import ThroughputWriter

SETUP = {
    "strategy": "_DefaultDistributionStrategy",
    "num_workers": 1,
    "num_replicas": 1,
    "device_kind": "CPU",
    "per_replica_batch_size": 32,
    "global_batch_size": 32,
    "dtype_policy": "float32",
}


class _Figures:
    """A caller's figures: a startup time that changes, as measured ones do."""

    def __init__(self):
        self.startup_time_s = None

    def record(self):
        if self.startup_time_s is None:
            return None
        return _run_record.build_record(SETUP, startup_time_s=self.startup_time_s)


def _wait_for(condition, timeout_s=5.0):
    start_s = time.monotonic()
    while not condition() and time.monotonic() - start_s < timeout_s:
        time.sleep(0.05)
    return condition()


def _points(log_dir):
    scalars = _tensorboard.read_scalars(_tensorboard.run_dir(log_dir))
    return scalars.get("throughput/samples_per_sec", [])


def _startup_in_json(log_dir):
    path = log_dir / "throughput.json"
    return path.exists() and _run_record.read_throughput_json(path)["startup_time_s"]


def test_points_reach_the_event_file_without_a_flush_while_the_fit_runs(tmp_path):
    figures = _Figures()
    writer = ThroughputWriter(str(tmp_path), figures.record)
    try:
        writer.scalars(10, {"throughput/samples_per_sec": 100.0})
        writer.scalars(20, {"throughput/samples_per_sec": 200.0})
        # TensorBoard's writer thread flushes within its interval (2 s).
        assert _wait_for(lambda: [step for step, _ in _points(tmp_path)] == [10, 20])
    finally:
        writer.stop()


def test_the_record_is_rewritten_at_points_every_2_s_and_complete_on_stop(tmp_path):
    figures = _Figures()
    writer = ThroughputWriter(str(tmp_path), figures.record)
    figures.startup_time_s = 1.5
    writer.changed()
    writer.save()  # at an epoch's end
    assert _startup_in_json(tmp_path) == 1.5
    figures.startup_time_s = 2.5
    writer.changed()
    writer.scalars(10, {"throughput/samples_per_sec": 100.0})
    assert _startup_in_json(tmp_path) == 1.5  # rewritten less than 2 s ago
    time.sleep(_writer._RECORD_EVERY_S)
    writer.scalars(20, {"throughput/samples_per_sec": 110.0})
    assert _startup_in_json(tmp_path) == 2.5
    figures.startup_time_s = 3.5
    writer.changed()
    writer.stop()
    assert _startup_in_json(tmp_path) == 3.5
    assert _points(tmp_path) == [(10, 100.0), (20, 110.0)]


def test_a_stopped_writer_leaves_no_thread_and_no_open_file(tmp_path):
    threads_before = set(threading.enumerate())
    figures = _Figures()
    writer = ThroughputWriter(str(tmp_path), figures.record)
    writer.scalars(10, {"throughput/samples_per_sec": 100.0})
    writer.text(10, "throughput/advice", "advice")
    writer.stop()

    assert set(threading.enumerate()) - threads_before == set()
    assert os.path.abspath(_tensorboard.run_dir(tmp_path)) not in _tensorboard.open_event_files()


def test_a_step_written_by_an_earlier_run_is_not_written_again(tmp_path):
    figures = _Figures()
    earlier = ThroughputWriter(str(tmp_path), figures.record)
    earlier.scalars(30, {"throughput/samples_per_sec": 1.0})  # its file still open
    resumed = ThroughputWriter(str(tmp_path), figures.record)
    resumed.scalars(20, {"throughput/samples_per_sec": 2.0})
    resumed.scalars(40, {"throughput/samples_per_sec": 4.0})
    resumed.stop()
    assert _points(tmp_path) == [(30, 1.0), (40, 4.0)]


def test_a_step_in_a_closed_event_file_is_not_written_again(tmp_path):
    _tensorboard.write_scalars(tmp_path, 30, {"throughput/samples_per_sec": 1.0})
    _tensorboard.close(tmp_path)  # as an earlier process leaves it
    figures = _Figures()
    resumed = ThroughputWriter(str(tmp_path), figures.record)
    resumed.scalars(20, {"throughput/samples_per_sec": 2.0})
    resumed.scalars(40, {"throughput/samples_per_sec": 4.0})
    resumed.stop()
    assert _points(tmp_path) == [(30, 1.0), (40, 4.0)]


def test_the_first_save_makes_the_log_directory_even_for_the_record_alone(tmp_path):
    log_dir = tmp_path / "logs"
    figures = _Figures()
    writer = ThroughputWriter(str(log_dir), figures.record)
    assert not log_dir.exists()
    figures.startup_time_s = 1.5
    writer.changed()
    writer.save()
    assert _startup_in_json(log_dir) == 1.5
    assert os.path.isdir(_tensorboard.run_dir(log_dir))


def test_a_failed_write_lets_the_fit_go_on_and_is_raised_when_it_stops(tmp_path):
    (tmp_path / "throughput.json").mkdir()  # a record cannot replace a directory
    figures = _Figures()
    writer = ThroughputWriter(str(tmp_path), figures.record)
    figures.startup_time_s = 1.5
    writer.changed()
    writer.scalars(10, {"throughput/samples_per_sec": 100.0})  # does not raise
    writer.save()
    writer.scalars(20, {"throughput/samples_per_sec": 200.0})

    with pytest.raises(OSError, match=str(tmp_path)):
        writer.stop()
    assert _points(tmp_path) == [(10, 100.0), (20, 200.0)]
