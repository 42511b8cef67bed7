"""Real workloads on 2 replicas: keras-hub's BERT classifier, GPT-2 causal LM and
ResNet classifier, and keras.io's `TextVectorization` model on raw strings.

Each model (see `real_models_common.py`) trains once per session on 2
replicas of a MirroredStrategy over logical CPUs, from
`keras_scaling.data.distribute`, with `ReplicaSyncCheck` and
`ThroughputLogger`; the tests read what that run left.
"""

import numpy as np
import pytest
import tensorflow as tf
from real_models_common import (
    EPOCHS,
    GLOBAL_BATCH_SIZE,
    MODELS,
    STEPS_PER_EPOCH,
    bert_data,
    gpt2_data,
    make_bert_classifier,
    make_gpt2_causal_lm,
    train,
)

from keras_scaling import compat

pytestmark = pytest.mark.logical_cpus(2)

_runs = {}


@pytest.fixture(scope="module")
def strategy():
    devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    assert len(devices) == 2
    return tf.distribute.MirroredStrategy(devices)


@pytest.fixture(scope="module")
def trained(strategy, tmp_path_factory):
    """`trained(name)`: the run of model `name`, trained at its first use."""

    def run_of(name):
        if name not in _runs:
            _runs[name] = train(name, strategy, str(tmp_path_factory.mktemp(name)))
        return _runs[name]

    yield run_of
    _runs.clear()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_trains_every_step_on_two_replicas_with_finite_losses(trained, name):
    run = trained(name)

    assert run.plan.num_replicas == 2
    assert run.plan.steps_per_epoch == STEPS_PER_EPOCH
    assert run.iterations == EPOCHS * STEPS_PER_EPOCH
    assert len(run.history["loss"]) == EPOCHS
    assert np.isfinite(run.history["loss"]).all(), run.history["loss"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_replicas_hold_equal_copies_of_every_variable(trained, name):
    run = trained(name)
    report = run.sync_report

    # The last check runs when training ends; a diverged copy would have raised.
    assert report.step == run.iterations
    assert report.num_replicas == 2
    assert report.num_variables == len(run.model.variables) + len(run.model.optimizer.variables)
    assert (report.divergences, report.float_drift) == ((), ()), str(report)
    per_replica_state = {v.path for v in report.per_replica_state}
    if MODELS[name][2] == "average":
        # BatchNormalization's moving statistics, each replica's own and
        # averaged at each check; nothing else.
        assert per_replica_state, str(report)
        assert all(v.repair == "averaged across replicas" for v in report.per_replica_state)
        assert {path.rsplit("/", 1)[1] for path in per_replica_state} == {
            "moving_mean",
            "moving_variance",
        }
    else:
        assert per_replica_state == set(), str(report)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_throughput_counts_the_global_batch_at_every_step(trained, name):
    run = trained(name)
    record = run.throughput_record()

    assert (record["num_replicas"], record["num_workers"]) == (2, 1)
    assert (record["per_replica_batch_size"], record["global_batch_size"]) == (
        GLOBAL_BATCH_SIZE // 2,
        GLOBAL_BATCH_SIZE,
    )
    assert record["strategy"] == "MirroredStrategy"
    # Samples are the steps times the global batch, in the run's figure and each epoch's.
    assert record["samples_per_sec"] == pytest.approx(GLOBAL_BATCH_SIZE * record["steps_per_sec"])
    assert 0 < record["steps_measured"] < run.iterations
    assert [entry["epoch"] for entry in record["epochs"]] == list(range(EPOCHS))
    assert [entry["samples_per_sec"] for entry in record["epochs"]] == run.history[
        "samples_per_sec"
    ]
    assert sum(entry["steps_measured"] for entry in record["epochs"]) == record["steps_measured"]


@pytest.mark.parametrize(
    ("make_model", "make_data"),
    [(make_bert_classifier, bert_data), (make_gpt2_causal_lm, gpt2_data)],
    ids=["bert_classifier", "gpt2_causal_lm"],
)
def test_keras_hub_text_models_take_a_bool_padding_mask(make_model, make_data):
    # What the symbolic_build fix is for: Keras' build from the first batch
    # cannot average a bool tensor over the replicas.
    data = make_data()
    text = data[0] if isinstance(data, tuple) else data
    features = make_model().preprocessor(tf.constant(text[:2]))
    features = features[0] if isinstance(features, tuple) else features

    assert features["padding_mask"].dtype == tf.bool
    assert compat.status()["symbolic_build"].needed
