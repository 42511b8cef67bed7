"""The step counter every callback reads: the batches trained, also with gradient accumulation.

With `gradient_accumulation_steps=N`, N batches make one weight update, and
recent Keras releases make the optimizer's public `iterations` the number of
updates. keras_scaling counts batches, as `fit`'s steps do (samples trained,
steps per second, a resume's position); `ReplicaSyncCheck` counts weight
updates. Each test trains for real with N=2 and reads what a callback saw.
"""

import json
import logging

import keras
import numpy as np
import pytest

import keras_scaling
from keras_scaling.fit_hooks import _step_counter
from keras_scaling.internals import _probes
from keras_scaling.preemption import _backup

NUM_FEATURES = 4
BATCH_SIZE = 8
BATCHES = 6


def _model(gradient_accumulation_steps=None):
    model = keras.Sequential([keras.Input((NUM_FEATURES,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(gradient_accumulation_steps=gradient_accumulation_steps)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _data(batches=BATCHES):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batches * BATCH_SIZE, NUM_FEATURES)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def _fit(model, callbacks=(), batches=BATCHES, epochs=1):
    x, y = _data(batches)
    return model.fit(
        x, y, batch_size=BATCH_SIZE, epochs=epochs, callbacks=list(callbacks), verbose=0
    )


@pytest.fixture
def failing_counter_probe(monkeypatch):
    """The probe of the batch counter fails, as if Keras had moved `_iterations`."""
    _probes._warned.clear()
    monkeypatch.setenv(_probes.FAIL_PROBES_ENV, "keras.optimizer.batch_counter")
    yield
    monkeypatch.delenv(_probes.FAIL_PROBES_ENV)
    _probes._warned.clear()


def test_weight_updates_counts_only_whole_updates():
    assert _step_counter.weight_updates(7, 2) == 3
    assert _step_counter.weight_updates(6, 1) == 6


def test_the_counter_reads_batches_trained_without_accumulation():
    model = _model()
    _fit(model)
    assert _step_counter.BatchCounter(model).read() == BATCHES


def test_the_counter_reads_batches_not_weight_updates_with_gradient_accumulation():
    model = _model(gradient_accumulation_steps=2)
    _fit(model)
    counter = _step_counter.BatchCounter(model)
    assert counter.read() == BATCHES
    assert _step_counter.accumulation_steps(model.optimizer) == 2
    assert _step_counter.weight_updates(counter.read(), 2) == BATCHES // 2


def test_the_counter_follows_training_after_its_first_read():
    model = _model(gradient_accumulation_steps=2)
    counter = _step_counter.BatchCounter(model)
    _fit(model)
    first = counter.read()
    _fit(model)
    assert (first, counter.read()) == (BATCHES, 2 * BATCHES)


def test_throughput_logger_measures_the_same_steps_with_gradient_accumulation(tmp_path):
    measured = {}
    for steps in (None, 2):
        logger = keras_scaling.ThroughputLogger(
            tmp_path / f"acc{steps}", baseline=None, update_freq=4, warmup_steps=2
        )
        _fit(_model(gradient_accumulation_steps=steps), [logger], batches=32)
        record = json.loads((tmp_path / f"acc{steps}" / "throughput.json").read_text())
        measured[steps] = record["steps_measured"]
    assert measured[2] == measured[None] > 0


def test_backup_position_counts_batches_with_gradient_accumulation(tmp_path):
    backup = keras_scaling.BackupAndRestore(tmp_path, delete_checkpoint=False)
    _fit(_model(gradient_accumulation_steps=2), [backup])
    header, _ = _backup.read(tmp_path)
    assert header["position"]["iterations"] == BATCHES


def test_replica_sync_check_counts_weight_updates_with_gradient_accumulation():
    model = _model(gradient_accumulation_steps=2)
    check = keras_scaling.ReplicaSyncCheck(every_n_steps=1)
    _fit(model, [check])
    assert check.check().step == BATCHES // 2


def test_without_the_counter_throughput_logger_measures_nothing_and_warns_once(
    tmp_path, caplog, failing_counter_probe
):
    logger = keras_scaling.ThroughputLogger(tmp_path, baseline=None, update_freq=4)
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        history = _fit(_model(gradient_accumulation_steps=2), [logger], batches=32, epochs=2)
    assert len(history.history["loss"]) == 2
    warnings = [r.getMessage() for r in caplog.records if "is not usable" in r.getMessage()]
    assert len(warnings) == 1 and "keras.Optimizer._iterations" in warnings[0]
    path = tmp_path / "throughput.json"
    assert not path.exists() or json.loads(path.read_text())["samples_per_sec"] is None


def test_without_the_counter_a_backup_is_refused_with_the_reason(tmp_path, failing_counter_probe):
    backup = keras_scaling.BackupAndRestore(tmp_path)
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        _fit(_model(gradient_accumulation_steps=2), [backup])


def test_without_the_counter_no_accumulation_needs_no_probe(tmp_path, failing_counter_probe):
    model = _model()
    _fit(model)
    assert _step_counter.BatchCounter(model).read() == BATCHES
