"""ThroughputLogger's model FLOPs, TFLOP/s and MFU: real fits on 2 replicas, events read back."""

import json
import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_scaling
from keras_scaling.mfu import flops
from keras_scaling.summaries import _tensorboard

NUM_FEATURES = 8
FLOPS_PER_SAMPLE = 5.0e6
PEAK_FLOPS = 2.0e11


@pytest.fixture(scope="module")
def mirrored():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _fit(strategy, log_dir, layers, **logger_kwargs):
    with strategy.scope():
        model = keras.Sequential([keras.Input((NUM_FEATURES,)), *layers, keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, NUM_FEATURES)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True)))
    model.fit(
        dataset.batch(32, drop_remainder=True),
        epochs=2,
        verbose=0,
        callbacks=[
            keras_scaling.ThroughputLogger(
                log_dir, baseline=1000.0, update_freq=3, warmup_steps=2, **logger_kwargs
            )
        ],
    )
    return model


def _events(log_dir):
    scalars = _tensorboard.read_scalars(_tensorboard.run_dir(log_dir))
    return {
        tag: dict(points)
        for tag, points in scalars.items()
        if tag.startswith(("throughput/", "scaling/"))
    }


def _record(log_dir):
    with open(os.path.join(log_dir, "throughput.json")) as file:
        return json.load(file)


@pytest.fixture(scope="module")
def given_run(mirrored, tmp_path_factory):
    log_dir = str(tmp_path_factory.mktemp("given"))
    _fit(
        mirrored,
        log_dir,
        [keras.layers.Dense(16)],
        flops_per_sample=FLOPS_PER_SAMPLE,
        peak_flops=PEAK_FLOPS,
    )
    return log_dir


@pytest.mark.logical_cpus(2)
def test_mfu_in_the_event_files_is_flops_times_samples_per_sec_over_peak_times_replicas(given_run):
    events = _events(given_run)
    samples_per_sec = events["throughput/samples_per_sec"]
    assert samples_per_sec
    for step, value in samples_per_sec.items():
        assert events["throughput/mfu"][step] == pytest.approx(
            FLOPS_PER_SAMPLE * value / (PEAK_FLOPS * 2), rel=1e-5
        )
        # On CPUs in GFLOP/s, so that the chart reads in plain numbers.
        assert events["throughput/gflops_per_sec"][step] == pytest.approx(
            FLOPS_PER_SAMPLE * value / 1e9, rel=1e-5
        )
        assert events["throughput/per_replica_gflops_per_sec"][step] == pytest.approx(
            FLOPS_PER_SAMPLE * value / 1e9 / 2, rel=1e-5
        )
    assert "throughput/tflops_per_sec" not in events


@pytest.mark.logical_cpus(2)
def test_given_numbers_are_used_as_given_in_throughput_json(given_run):
    record = _record(given_run)
    assert record["flops_per_sample"] == FLOPS_PER_SAMPLE
    assert record["flops_source"] == "given"
    assert record["peak_flops_per_replica"] == PEAK_FLOPS
    assert record["peak_source"] == "given"
    assert record["mfu"] == pytest.approx(
        FLOPS_PER_SAMPLE * record["samples_per_sec"] / (PEAK_FLOPS * 2)
    )


@pytest.mark.logical_cpus(2)
def test_setup_text_shows_flops_and_peak(given_run):
    summaries = _tensorboard.read_summaries(_tensorboard.run_dir(given_run))
    (point,) = summaries["throughput/setup_measuring"]
    text = point.value
    assert "| model FLOPs per sample | 5.00 MFLOPs (given) |" in text
    assert "| peak FLOP/s | 200 GFLOP/s per replica (given) |" in text


@pytest.mark.logical_cpus(2)
def test_auto_counts_one_replica_batch_once_before_measuring(mirrored, tmp_path):
    model = _fit(
        mirrored, str(tmp_path), [keras.layers.Dense(64, activation="relu")], peak_flops=None
    )
    record = _record(str(tmp_path))
    expected = flops.training_flops_per_sample(
        model, sample=(tf.TensorSpec([16, NUM_FEATURES]), tf.TensorSpec([16, 1]))
    )
    assert record["flops_source"] == "counted"
    assert record["flops_per_sample"] == pytest.approx(expected)
    assert record["mfu"] is None
    events = _events(str(tmp_path))
    assert "throughput/gflops_per_sec" in events
    assert "throughput/mfu" not in events


@pytest.mark.logical_cpus(2)
def test_rnn_model_gets_no_flops_and_no_mfu_with_the_reason(mirrored, tmp_path, caplog):
    log_dir = str(tmp_path)
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        _fit(
            mirrored,
            log_dir,
            [keras.layers.Reshape((4, 2)), keras.layers.SimpleRNN(4)],
            peak_flops=PEAK_FLOPS,
        )
    record = _record(log_dir)
    assert record["flops_per_sample"] is None
    assert record["flops_source"].startswith("not counted: the model runs a loop")
    assert record["mfu"] is None
    events = _events(log_dir)
    assert "throughput/samples_per_sec" in events
    assert not {"throughput/mfu", "throughput/gflops_per_sec"} & set(events)
    assert caplog.text.count("no model FLOPs, so no FLOP/s or MFU tags") == 1


@pytest.mark.logical_cpus(2)
def test_high_efficiency_with_low_mfu_advises_once_naming_the_batch(mirrored, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        # A baseline of 1 sample/sec makes efficiency high; a huge peak, MFU
        # low. Hidden layers make a step take far longer than reading its
        # batch, so the input pipeline is never the advice, however loaded
        # the machine.
        with mirrored.scope():
            model = keras.Sequential(
                [
                    keras.Input((NUM_FEATURES,)),
                    keras.layers.Dense(1024, activation="relu"),
                    keras.layers.Dense(1024, activation="relu"),
                    keras.layers.Dense(1),
                ]
            )
            model.compile(optimizer="sgd", loss="mse")
        x = np.ones((512, NUM_FEATURES), "float32")
        dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32, drop_remainder=True)
        model.fit(
            dataset,
            epochs=2,
            verbose=0,
            callbacks=[
                keras_scaling.ThroughputLogger(
                    str(tmp_path),
                    baseline=1.0,
                    update_freq=2,
                    warmup_steps=1,
                    flops_per_sample=FLOPS_PER_SAMPLE,
                    peak_flops=1e18,
                )
            ],
        )
    advice = [
        r.getMessage() for r in caplog.records if "every replica is underused" in r.getMessage()
    ]
    assert len(advice) == 1
    assert "A per-replica batch of 16" in advice[0]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"flops_per_sample": 0}, ValueError, "flops_per_sample must be a positive number"),
        ({"flops_per_sample": "count"}, ValueError, "got 'count'"),
        ({"peak_flops": -1e12}, ValueError, "peak_flops must be a positive number"),
        ({"peak_flops": "datasheet"}, ValueError, "got 'datasheet'"),
    ],
)
def test_bad_flops_arguments_are_refused_in_the_constructor(tmp_path, kwargs, error, message):
    with pytest.raises(error, match=message):
        keras_scaling.ThroughputLogger(str(tmp_path), **kwargs)


def test_a_device_without_a_peak_is_named_once_per_process(tmp_path, caplog):
    from keras_scaling.mfu import _throughput_flops

    _throughput_flops._PEAK_REASONS_LOGGED.clear()  # earlier tests of this process named it
    model = keras.Sequential([keras.Input((NUM_FEATURES,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((256, NUM_FEATURES), "float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32, drop_remainder=True)
    # At INFO level on a CPU, whose peak no datasheet gives: the set-up table says it.
    with caplog.at_level(logging.INFO, logger="keras_scaling"):
        for run in ("a", "b"):
            model.fit(
                dataset,
                verbose=0,
                callbacks=[
                    keras_scaling.ThroughputLogger(
                        str(tmp_path / run), update_freq=2, warmup_steps=1
                    )
                ],
            )
    assert caplog.text.count("MFU needs peak_flops=") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "MFU" in r.message]
    record = _record(str(tmp_path / "b"))
    assert record["flops_source"] == "counted"
    assert record["peak_source"].startswith(
        "unknown: the peak FLOP/s of CPU is not in keras_scaling's table"
    )
    assert "PEAK_FLOPS" not in caplog.text
    assert record["mfu"] is None
