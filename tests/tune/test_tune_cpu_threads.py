"""The CPU thread pools as a knob of tune: the candidates, and `use_logical_cpus` applying them."""

import json
import os
import subprocess
import sys

import pytest

import keras_scaling
from keras_scaling.tune import _candidates, _report

BENCH_POOLS = {"n": 2, "threads_per_device": 1, "inter_op_threads": 2}


def test_the_pools_tried_are_tensorflows_own_then_all_cores_per_device():
    values, reason = _candidates.cpu_thread_values(BENCH_POOLS, 4)
    assert reason is None
    assert values == ({"n": 2}, {"n": 2, "threads_per_device": 4, "inter_op_threads": 2})


def test_the_start_itself_is_not_tried_again():
    start = {"n": 2, "threads_per_device": 2, "inter_op_threads": 2}
    assert _candidates.cpu_thread_values(start, 2) == (({"n": 2},), None)


def test_devices_other_than_logical_cpus_have_no_pools_to_search():
    assert _candidates.cpu_thread_values({}, 8) == ((), "the devices are not logical CPUs")


def test_a_pools_candidate_replaces_the_whole_cpu_section_only():
    start = {"compile": {"steps_per_execution": 8}, "data": {}, "strategy": {}, "cpu": BENCH_POOLS}
    changed = _candidates.with_value(start, "cpu_threads", {"n": 2})
    assert changed["cpu"] == {"n": 2}
    assert changed["compile"] == {"steps_per_execution": 8}
    assert start["cpu"] == BENCH_POOLS


def test_the_apply_lines_split_the_cpu_first_when_the_pools_were_kept():
    record = {"best": {"settings": {"compile": {}, "data": {}, "strategy": {}, "cpu": {"n": 2}}}}
    lines = _report.apply_lines(record, "tune.json")
    assert lines[1].startswith("keras_scaling.use_logical_cpus(**tuned.cpu_kwargs)")


def test_load_reads_the_cpu_settings_and_files_without_them(tmp_path):
    settings = {"compile": {}, "data": {}, "strategy": {}}
    record = {
        "start": {"samples_per_sec": 1.0, "settings": settings},
        "best": {"samples_per_sec": 2.0, "settings": {**settings, "cpu": {"n": 2}}},
    }
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(record))
    assert keras_scaling.tune.load(path).cpu_kwargs == {"n": 2}
    assert keras_scaling.tune.load(path, "start").cpu_kwargs == {}


_APPLY = """
import os, tensorflow as tf, keras_scaling
os.environ.pop("TF_OVERRIDE_GLOBAL_THREADPOOL", None)
names = keras_scaling.use_logical_cpus(2, threads_per_device=1, inter_op_threads=3)
strategy = keras_scaling.auto_strategy()
out = [len(names), strategy.num_replicas_in_sync,
       tf.config.threading.get_intra_op_parallelism_threads(),
       tf.config.threading.get_inter_op_parallelism_threads(),
       os.environ.get("TF_OVERRIDE_GLOBAL_THREADPOOL")]
keras_scaling.use_logical_cpus(2, threads_per_device=1, inter_op_threads=3)  # the same: harmless
try:
    keras_scaling.use_logical_cpus(2, inter_op_threads=4)
except RuntimeError as error:
    out.append(str(error))
print(out)
"""


def test_use_logical_cpus_sets_a_pool_per_device_before_the_devices_exist():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", _APPLY], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = eval(result.stdout.strip().splitlines()[-1])  # noqa: S307 (our own print)
    assert out[:5] == [2, 2, 1, 3, "1"]
    assert "after TensorFlow initialised its devices" in out[5]


@pytest.mark.parametrize("name", ["threads_per_device", "inter_op_threads"])
def test_a_pool_of_no_threads_is_refused_naming_the_parameter(name):
    with pytest.raises(ValueError, match=f"{name} must be a positive integer, got 0"):
        keras_scaling.use_logical_cpus(2, **{name: 0})
