"""ThroughputLogger's writer: points and throughput.json written by a thread of its own."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

from keras_scaling.summaries import _tensorboard
from keras_scaling.throughput import _run_record
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
        self.lock = threading.RLock()
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


def test_points_reach_the_event_file_from_the_thread_while_the_fit_runs(tmp_path):
    figures = _Figures()
    writer = ThroughputWriter(str(tmp_path), figures.record, figures.lock)
    writer.start()
    try:
        writer.scalars(10, {"throughput/samples_per_sec": 100.0})
        writer.scalars(20, {"throughput/samples_per_sec": 200.0})
        assert _wait_for(lambda: [step for step, _ in _points(tmp_path)] == [10, 20])
    finally:
        writer.stop()


def test_the_record_is_rewritten_after_an_epoch_and_complete_on_stop(tmp_path):
    figures = _Figures()
    writer = ThroughputWriter(str(tmp_path), figures.record, figures.lock, record_every_s=60)
    writer.start()
    with figures.lock:
        figures.startup_time_s = 1.5
        writer.changed(epoch_ended=True)
    writer.save_soon()
    assert _wait_for(lambda: _startup_in_json(tmp_path) == 1.5)
    with figures.lock:
        figures.startup_time_s = 2.5
        writer.changed()  # not an epoch: the record waits (up to a minute here)
    writer.scalars(10, {"throughput/samples_per_sec": 100.0})
    # The point is flushed by the save after the change: that save has run.
    assert _wait_for(lambda: _points(tmp_path) == [(10, 100.0)], timeout_s=30.0)
    assert _startup_in_json(tmp_path) == 1.5
    writer.stop()
    assert _startup_in_json(tmp_path) == 2.5


def test_a_step_written_by_an_earlier_run_is_not_written_again(tmp_path):
    figures = _Figures()
    earlier = ThroughputWriter(str(tmp_path), figures.record, figures.lock)
    earlier.scalars(30, {"throughput/samples_per_sec": 1.0})  # no fit running: now
    resumed = ThroughputWriter(str(tmp_path), figures.record, figures.lock)
    resumed.scalars(20, {"throughput/samples_per_sec": 2.0})
    resumed.scalars(40, {"throughput/samples_per_sec": 4.0})
    assert _points(tmp_path) == [(30, 1.0), (40, 4.0)]


def test_a_step_in_a_run_directory_left_by_another_process_is_not_written_again(tmp_path):
    # An event file this process did not open: the writer finds the directory
    # there and reads it back.
    left = _tensorboard._EventFile(_tensorboard.run_dir(tmp_path))
    left.write_values(30, [("throughput/samples_per_sec", _float_tensor(1.0))], _no_metadata)
    left.flush()
    figures = _Figures()
    resumed = ThroughputWriter(str(tmp_path), figures.record, figures.lock)
    resumed.scalars(20, {"throughput/samples_per_sec": 2.0})
    resumed.scalars(40, {"throughput/samples_per_sec": 4.0})
    assert _points(tmp_path) == [(30, 1.0), (40, 4.0)]


def test_the_first_save_makes_the_log_directory_even_for_the_record_alone(tmp_path):
    # No point written: nothing but the writer's first save makes the
    # directory that throughput.json goes to.
    log_dir = tmp_path / "logs"
    figures = _Figures()
    writer = ThroughputWriter(str(log_dir), figures.record, figures.lock)
    assert not log_dir.exists()
    with figures.lock:
        figures.startup_time_s = 1.5
        writer.changed()
    writer.save()
    assert _startup_in_json(log_dir) == 1.5
    assert os.path.isdir(_tensorboard.run_dir(log_dir))


# The writer stopped from inside one of its own background saves: the end of a
# fit that raised, when a garbage collection in the save thread frees that
# fit's iterator (`_fit_end.FitChanges.watch`). In a process of its own: a
# save thread that deadlocks would stop every later save of the process.
_STOP_INSIDE_A_SAVE = textwrap.dedent(
    """
    import json, os, sys, threading
    from keras_scaling.summaries import _tensorboard
    from keras_scaling.throughput import _background_save, _run_record
    from keras_scaling.throughput._writer import ThroughputWriter

    log_dir, setup = sys.argv[1], json.loads(sys.argv[2])
    lock = threading.RLock()
    startup = {"s": None}
    stopped = threading.Event()

    def record():
        if startup["s"] is None:
            return None
        built = _run_record.build_record(setup, startup_time_s=startup["s"])
        if _background_save._save_thread.is_current() and not stopped.is_set():
            # The fit ends here, with a figure newer than this save's record.
            startup["s"] = 2.5
            writer.changed()
            writer.stop()
            stopped.set()
        return built

    writer = ThroughputWriter(log_dir, record, lock)
    writer.start()
    writer.scalars(10, {"throughput/samples_per_sec": 100.0})
    with lock:
        startup["s"] = 1.5
        writer.changed(epoch_ended=True)
    writer.save_soon()
    ended = stopped.wait(20)
    if ended:
        with writer._save_lock:  # the save that stop() was called in has ended
            pass
    path = os.path.join(log_dir, "throughput.json")
    print(json.dumps({
        "stopped": ended,
        "startup_time_s": (
            _run_record.read_throughput_json(path)["startup_time_s"] if os.path.exists(path) else None
        ),
        "points": _tensorboard.read_scalars(_tensorboard.run_dir(log_dir)).get(
            "throughput/samples_per_sec", []
        ),
        "open_event_files": len(_tensorboard.open_event_files()),
    }), flush=True)
    os._exit(0)
    """
)


def test_a_writer_stopped_from_inside_its_own_save_finishes_that_save_and_closes_its_file(
    tmp_path,
):
    result = subprocess.run(
        [sys.executable, "-c", _STOP_INSIDE_A_SAVE, str(tmp_path), json.dumps(SETUP)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["stopped"], "stop() inside a background save never returned"
    # The save under way ran again for what stop() asked: the last figures.
    assert outcome["startup_time_s"] == 2.5
    assert outcome["points"] == [[10, 100.0]]
    assert outcome["open_event_files"] == 0


# A saver that leaves (its fit ended) while the save thread holds its own
# lock, copying its savers: what a garbage collection during that copy does.
_SAVER_LEAVING_WHILE_THE_SAVERS_ARE_COPIED = textwrap.dedent(
    """
    import os, threading
    from keras_scaling.throughput import _background_save

    save_thread = _background_save._save_thread
    left = threading.Event()

    class CopiedUnderTheLock(list):
        def __iter__(self):
            if save_thread.is_current() and not left.is_set():
                left.set()
                leaving.stop()
            return super().__iter__()

    leaving = _background_save.BackgroundSave(lambda: None)
    save_thread._savers = CopiedUnderTheLock(save_thread._savers)
    saved = threading.Event()
    later = _background_save.BackgroundSave(saved.set, first_gap_s=0.0)
    later.news()
    print(left.wait(10), saved.wait(10), leaving in save_thread._savers, flush=True)
    os._exit(0)
    """
)


def test_a_saver_leaving_while_the_save_thread_copies_its_savers_leaves_the_thread_saving():
    result = subprocess.run(
        [sys.executable, "-c", _SAVER_LEAVING_WHILE_THE_SAVERS_ARE_COPIED],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    left, saved, still_registered = result.stdout.split()
    assert left == "True"
    assert saved == "True", "the save thread hung on its own lock"
    assert still_registered == "False"


def _float_tensor(value):
    from tensorboard.compat.proto import tensor_pb2, types_pb2

    return tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[value])


def _no_metadata(display_name, description):
    from tensorboard.compat.proto import summary_pb2

    return summary_pb2.SummaryMetadata()
