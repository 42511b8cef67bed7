"""ThroughputLogger's `samples_per_sec` in the epoch logs: every epoch has one, from the first."""

import contextlib
import csv
import json
import math
import os
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_scaling

GLOBAL_BATCH_SIZE = 32


def _model(strategy=None, steps_per_execution=1):
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    return model


def _dataset(steps, drop_remainder=True):
    x = np.random.default_rng(0).normal(size=(steps * GLOBAL_BATCH_SIZE, 8)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(
        GLOBAL_BATCH_SIZE, drop_remainder=drop_remainder
    )


def _json(log_dir):
    with open(os.path.join(log_dir, "throughput.json")) as file:
        return json.load(file)


class BatchTimes(keras.callbacks.Callback):
    """The clock as each train batch begins and ends, per epoch."""

    def __init__(self):
        super().__init__()
        self.begin_s, self.end_s = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.begin_s.append([])
        self.end_s.append([])

    def on_train_batch_begin(self, batch, logs=None):
        self.begin_s[-1].append(time.perf_counter())

    def on_train_batch_end(self, batch, logs=None):
        self.end_s[-1].append(time.perf_counter())


@pytest.fixture(scope="module")
def mirrored():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _check_four_epochs_of_three_steps(model, tmp_path):
    times = BatchTimes()
    csv_path = tmp_path / "log.csv"
    history = model.fit(
        _dataset(3),
        epochs=4,
        verbose=0,
        callbacks=[
            times,
            keras_scaling.ThroughputLogger(tmp_path, baseline=None),
            keras.callbacks.CSVLogger(str(csv_path)),
        ],
    )
    figures = history.history["samples_per_sec"]
    assert {len(values) for values in history.history.values()} == {4}
    assert all(figure > 0 for figure in figures)
    with open(csv_path) as file:
        assert [float(row["samples_per_sec"]) for row in csv.DictReader(file)] == (
            pytest.approx(figures)
        )
    # The first epoch is all warm-up: its 2 steps after its first call over
    # their time, from a read in the first call to a read in the third. The
    # batch hooks run outside the calls, so they bound that time.
    begin_s, end_s = times.begin_s[0], times.end_s[0]
    samples = 2 * GLOBAL_BATCH_SIZE
    assert samples / (end_s[2] - begin_s[0]) < figures[0] < samples / (begin_s[2] - end_s[0])
    record = _json(tmp_path)
    assert [entry["epoch"] for entry in record["epochs"]] == [0, 1, 2, 3]
    assert [entry["samples_per_sec"] for entry in record["epochs"]] == figures
    # The run's steady state leaves the warm-up out: epochs 1 to 3, 2 steps each.
    assert record["steps_measured"] == 6


def test_a_first_epoch_too_short_to_measure_has_its_figure_in_history_and_csv(tmp_path):
    _check_four_epochs_of_three_steps(_model(), tmp_path)


@pytest.mark.logical_cpus(2)
def test_a_first_epoch_too_short_to_measure_has_its_figure_on_two_replicas(mirrored, tmp_path):
    _check_four_epochs_of_three_steps(_model(mirrored), tmp_path)


# Seconds each optimizer step takes, by the step's number (1-based): the first
# epoch (steps 1 to 12) 20 ms a step; the second 10 ms, but steps 15 to 18 50 ms.
def _step_time_s(step):
    if step <= 12:
        return 0.02
    return 0.05 if 15 <= step <= 18 else 0.01


def test_a_short_epoch_reads_samples_over_time_and_a_long_one_keeps_its_median(tmp_path):
    model = _model()
    # Time is the steps taken so far: the figures are known exactly.
    logger = keras_scaling.ThroughputLogger(
        tmp_path,
        baseline=None,
        update_freq=2,
        warmup_steps=11,
        clock=lambda: sum(map(_step_time_s, range(1, int(model.optimizer.iterations) + 1))),
    )
    history = model.fit(_dataset(12), epochs=2, verbose=0, callbacks=[logger])
    # Epoch 0 is warm-up from its first call (step 1) to its end (step 12):
    # 11 steps of 20 ms. Epoch 1 is read at steps 13 (its first call), 14, 16,
    # ..., 24: its median step takes 10 ms, though over the whole epoch a step
    # takes 270 ms / 11.
    assert history.history["samples_per_sec"] == pytest.approx([32 / 0.02, 32 / 0.01])
    record = _json(tmp_path)
    assert record["epochs"] == [
        {"epoch": 0, "samples_per_sec": pytest.approx(32 / 0.02), "steps_measured": 11},
        {"epoch": 1, "samples_per_sec": pytest.approx(32 / 0.01), "steps_measured": 11},
    ]
    assert (record["samples_per_sec"], record["steps_measured"]) == (pytest.approx(3200.0), 11)


def test_an_epoch_of_one_call_is_nan(tmp_path):
    model = _model(steps_per_execution=2)
    logger = keras_scaling.ThroughputLogger(tmp_path, baseline=None)
    history = model.fit(_dataset(2), epochs=3, verbose=0, callbacks=[logger])
    figures = history.history["samples_per_sec"]
    assert len(figures) == 3 and all(math.isnan(figure) for figure in figures)
    assert _json(tmp_path)["epochs"] == []


def test_a_fit_that_measures_nothing_has_nan_in_every_epoch(tmp_path):
    # A partial last batch, then a flat_map: no global batch size is known.
    dataset = _dataset(3).unbatch().take(80).batch(GLOBAL_BATCH_SIZE)
    dataset = dataset.flat_map(lambda x, y: tf.data.Dataset.from_tensors((x, y)))
    logger = keras_scaling.ThroughputLogger(tmp_path, baseline=None)
    history = _model().fit(dataset, epochs=2, verbose=0, callbacks=[logger])
    figures = history.history["samples_per_sec"]
    assert len(figures) == 2 and all(math.isnan(figure) for figure in figures)
