"""Baselines and throughput.json: resolving, reading, writing, measuring."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_scaling.throughput import baseline as baseline_lib


def _record(**changes):
    record = {
        "version": 1,
        "samples_per_sec": 1500.0,
        "steps_per_sec": 46.875,
        "step_time_s": {"p10": 0.02, "p50": 0.0213, "p90": 0.025},
        "num_replicas": 1,
        "num_workers": 1,
        "per_replica_batch_size": 32,
        "global_batch_size": 32,
        "device_kind": "CPU",
        "dtype_policy": "float32",
        "strategy": "_DefaultDistributionStrategy",
        "baseline_samples_per_sec": None,
        "baseline_source": None,
        "baseline_num_replicas": None,
        "speedup": None,
        "ideal_speedup": None,
        "efficiency": None,
        "steps_measured": 90,
        "startup_time_s": 1.25,
        "epochs": [{"epoch": 0, "samples_per_sec": 1500.0, "steps_measured": 90}],
        "flops_per_sample": 3.2e6,
        "flops_source": "counted",
        "peak_flops_per_replica": None,
        "peak_source": None,
        "mfu": None,
    }
    record.update(changes)
    return record


def test_throughput_json_round_trips(tmp_path):
    path = baseline_lib.write_throughput_json(tmp_path, _record())
    assert path == os.path.join(tmp_path, "throughput.json")
    assert baseline_lib.read_throughput_json(tmp_path) == _record()
    assert baseline_lib.read_throughput_json(path) == _record()
    assert os.listdir(tmp_path) == ["throughput.json"]  # no temporary file left


def test_write_refuses_a_record_off_the_schema(tmp_path):
    record = _record(extra=1)
    del record["speedup"]
    with pytest.raises(ValueError, match=r"missing \['speedup'\], unexpected \['extra'\]"):
        baseline_lib.write_throughput_json(tmp_path, record)


def test_files_written_before_the_later_keys_read_them_as_null(tmp_path):
    older = _record()
    for key in (
        "flops_per_sample",
        "flops_source",
        "peak_flops_per_replica",
        "peak_source",
        "mfu",
        "baseline_num_replicas",
        "ideal_speedup",
        "epochs",
    ):
        del older[key]
    (tmp_path / "throughput.json").write_text(json.dumps(older))
    record = baseline_lib.read_throughput_json(tmp_path)
    assert record["flops_per_sample"] is None and record["mfu"] is None
    assert record["baseline_num_replicas"] is record["epochs"] is None
    assert record["samples_per_sec"] == 1500.0


def test_speedup_of_a_record_uses_its_baseline_and_its_replicas():
    run = _record(
        samples_per_sec=3400.0,
        num_replicas=8,
        baseline_samples_per_sec=1000.0,
        baseline_num_replicas=2,
    )
    figures = baseline_lib.speedup_of(run)
    assert figures.speedup == pytest.approx(3.4)
    assert figures.ideal_speedup == 4.0
    assert figures.efficiency == pytest.approx(0.85)


def test_speedup_of_a_record_over_another_run_uses_that_runs_replicas():
    run = _record(samples_per_sec=1800.0, num_replicas=2, baseline_samples_per_sec=1.0)
    one_replica = _record(samples_per_sec=1000.0, num_replicas=1)
    figures = baseline_lib.speedup_of(run, one_replica)
    assert (figures.speedup, figures.ideal_speedup) == (pytest.approx(1.8), 2.0)


def test_speedup_of_a_record_without_a_baseline_is_none():
    assert baseline_lib.speedup_of(_record()) is None
    assert (
        baseline_lib.speedup_of(_record(samples_per_sec=None, baseline_samples_per_sec=9.0)) is None
    )


def test_old_records_without_baseline_replicas_count_one():
    run = _record(samples_per_sec=1800.0, num_replicas=2, baseline_samples_per_sec=1000.0)
    assert baseline_lib.speedup_of(run).ideal_speedup == 2.0


def test_numpy_number_is_a_baseline():
    assert baseline_lib.resolve_baseline(np.float32(1200.0)).samples_per_sec == 1200.0


def test_read_refuses_files_that_are_not_throughput_records(tmp_path):
    (tmp_path / "throughput.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read as JSON"):
        baseline_lib.read_throughput_json(tmp_path)
    (tmp_path / "throughput.json").write_text(json.dumps({"version": 2}))
    with pytest.raises(ValueError, match="not a version-1 throughput.json"):
        baseline_lib.read_throughput_json(tmp_path)


def test_number_is_a_one_replica_baseline():
    baseline = baseline_lib.resolve_baseline(1200)
    assert (baseline.mode, baseline.samples_per_sec, baseline.num_replicas) == ("number", 1200.0, 1)


@pytest.mark.parametrize("bad", [0, -5.0, float("inf"), float("nan")])
def test_non_positive_number_is_refused(bad):
    with pytest.raises(ValueError, match="baseline must be a positive number"):
        baseline_lib.resolve_baseline(bad)


@pytest.mark.parametrize("bad", [True, ["measure"], "fastest"])
def test_other_values_are_refused_with_what_is_allowed(bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises((TypeError, ValueError), match="baseline"):
        baseline_lib.resolve_baseline(bad)


def test_log_dir_or_file_of_an_earlier_run_gives_its_figure(tmp_path):
    baseline_lib.write_throughput_json(tmp_path, _record(num_replicas=2))
    for path in (tmp_path, tmp_path / "throughput.json", str(tmp_path)):
        baseline = baseline_lib.resolve_baseline(path)
        assert baseline.mode == "file"
        assert baseline.samples_per_sec == 1500.0
        assert baseline.num_replicas == 2
        assert baseline.source == str(tmp_path / "throughput.json")


def test_missing_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist; pass an earlier run's log_dir"):
        baseline_lib.resolve_baseline(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="does not exist"):
        baseline_lib.resolve_baseline(tmp_path)  # a directory without the file


def test_file_without_a_measured_figure_is_refused(tmp_path):
    baseline_lib.write_throughput_json(tmp_path, _record(samples_per_sec=None))
    with pytest.raises(ValueError, match="holds no measured samples_per_sec"):
        baseline_lib.resolve_baseline(tmp_path)


def test_measure_auto_and_none_are_resolved_later():
    assert baseline_lib.resolve_baseline("measure").mode == "measure"
    assert baseline_lib.resolve_baseline("auto").samples_per_sec is None
    assert baseline_lib.resolve_baseline(None) is None


def test_setup_differences_name_each_difference():
    differences = baseline_lib.setup_differences(
        _record(),
        per_replica_batch_size=64,
        dtype_policy="mixed_float16",
        device_kind="CPU",
    )
    assert differences == [
        "per-replica batch 32 in the baseline, 64 here",
        "dtype policy float32 in the baseline, mixed_float16 here",
    ]
    assert not baseline_lib.setup_differences(
        _record(), per_replica_batch_size=32, dtype_policy="float32", device_kind="CPU"
    )


def _compiled_model(steps_per_execution=1):
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse", steps_per_execution=steps_per_execution)
    return model


def test_measure_times_a_copy_and_leaves_the_model_alone():
    model = _compiled_model()
    model.fit(np.zeros((8, 16)), np.zeros((8, 1)), batch_size=8, verbose=0)
    weights = [w.numpy().copy() for w in model.weights]
    iterations = int(model.optimizer.iterations.numpy())
    spec = (tf.TensorSpec((8, 16), tf.float32), tf.TensorSpec((8, 1), tf.float32))
    samples_per_sec = baseline_lib.measure_samples_per_sec(
        model, spec, "/device:CPU:0", duration_s=0.2, min_steps=5
    )
    assert samples_per_sec > 0
    assert int(model.optimizer.iterations.numpy()) == iterations
    for before, after in zip(weights, model.weights):
        np.testing.assert_array_equal(before, after.numpy())


def test_measure_counts_samples_of_the_batch_it_times():
    model = _compiled_model()
    spec_small = (tf.TensorSpec((2, 16), tf.float32), tf.TensorSpec((2, 1), tf.float32))
    spec_large = (tf.TensorSpec((256, 16), tf.float32), tf.TensorSpec((256, 1), tf.float32))
    small = baseline_lib.measure_samples_per_sec(
        model, spec_small, "/device:CPU:0", duration_s=0.3, min_steps=5
    )
    large = baseline_lib.measure_samples_per_sec(
        model, spec_large, "/device:CPU:0", duration_s=0.3, min_steps=5
    )
    # A step costs far less than 128 times more for 128 times the samples.
    assert large > 4 * small


def test_measure_times_a_copy_that_keeps_an_adapted_vocabulary():
    # keras.io's text classification: the vocabulary TextVectorization adapted
    # is neither config nor weight, and a copy without it cannot train.
    words = np.array([["good film"], ["bad plot"], ["good cast"], ["poor film"]])
    vectorize = keras.layers.TextVectorization(max_tokens=8, output_sequence_length=4)
    vectorize.adapt(words[:, 0])
    inputs = keras.Input((1,), dtype="string")
    hidden = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(8, 4)(vectorize(inputs)))
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer="adam", loss="mse")
    spec = (tf.TensorSpec((4, 1), tf.string), tf.TensorSpec((4, 1), tf.float32))
    samples_per_sec = baseline_lib.measure_samples_per_sec(
        model, spec, "/device:CPU:0", duration_s=0.2, min_steps=5
    )
    assert samples_per_sec > 0
    assert vectorize.vocabulary_size() == 8


def test_measure_refuses_dynamic_shapes():
    model = _compiled_model()
    spec = (tf.TensorSpec((None, 16), tf.float32), tf.TensorSpec((None, 1), tf.float32))
    with pytest.raises(ValueError, match="needs batches of static shape"):
        baseline_lib.measure_samples_per_sec(model, spec, "/device:CPU:0")


def test_measure_says_when_the_model_cannot_be_copied():
    class Unclonable(keras.Model):
        def __init__(self, units):
            super().__init__()
            self.dense = keras.layers.Dense(units)

        def call(self, inputs):
            return self.dense(inputs)

    model = Unclonable(1)
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.zeros((4, 16)), np.zeros((4, 1)), verbose=0)
    spec = (tf.TensorSpec((4, 16), tf.float32), tf.TensorSpec((4, 1), tf.float32))
    with pytest.raises(ValueError, match="could not copy the model"):
        baseline_lib.measure_samples_per_sec(model, spec, "/device:CPU:0")
