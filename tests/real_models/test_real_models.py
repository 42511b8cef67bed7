"""Real workloads on 2 replicas: keras-hub's BERT classifier, GPT-2 causal LM and
ResNet classifier, and keras.io's `TextVectorization` model on raw strings.

Each model (see `real_models_common.py`) trains once per session on 2
replicas of a MirroredStrategy over logical CPUs, from
`keras_scaling.data.distribute`, with `ReplicaSyncCheck` and
`ThroughputLogger`; the tests read what that run left.

The BERT classifier is also stopped by SIGTERM in its second epoch and
resumed by `BackupAndRestore`, in this process, on a model and a
`keras_scaling.data.distribute` dataset built anew each time, as a new
process would: the resumed run ends with every model and optimizer variable
bitwise equal to the run never stopped (the dropout seeds, Adam's slots and
the shuffled order of the resumed epoch included).
"""

import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf
from real_models_common import (
    EPOCHS,
    GLOBAL_BATCH_SIZE,
    MODELS,
    STEPS_PER_EPOCH,
    bert_data,
    build,
    distributed,
    gpt2_data,
    make_bert_classifier,
    make_gpt2_causal_lm,
    train,
    variable_values,
)

import keras_scaling
from keras_scaling import compat
from keras_scaling.preemption import _backup
from keras_scaling.preemption.backup_and_restore import EXIT_PREEMPTED
from keras_scaling.summaries import _tensorboard

pytestmark = pytest.mark.logical_cpus(2)

_runs = {}
# Step 3 of the second epoch; the backup is saved at the end of the step in progress.
SIGTERM_AT_STEP = STEPS_PER_EPOCH + 3


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


def scalars(run, tag):
    """`[(step, value)]` of `tag` in the run's TensorBoard events, every point kept."""
    return _tensorboard.read_scalars(_tensorboard.run_dir(run.log_dir)).get(tag, [])


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
    # Every 4 steps and at the end, each written once, none diverged.
    diverged = scalars(run, "replica_sync/diverged_variables")
    assert diverged == [(step, 0) for step in range(0, run.iterations + 1, 4)]
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
    # Samples are the steps times the global batch, in the run's figure and at every point.
    assert record["samples_per_sec"] == pytest.approx(GLOBAL_BATCH_SIZE * record["steps_per_sec"])
    samples_per_sec = dict(scalars(run, "throughput/samples_per_sec"))
    assert samples_per_sec
    for step, steps_per_sec in scalars(run, "throughput/steps_per_sec"):
        assert samples_per_sec[step] == pytest.approx(GLOBAL_BATCH_SIZE * steps_per_sec, rel=1e-5)
    assert 0 < record["steps_measured"] < run.iterations
    assert [entry["epoch"] for entry in record["epochs"]] == list(range(EPOCHS))
    assert [entry["samples_per_sec"] for entry in record["epochs"]] == run.history[
        "samples_per_sec"
    ]
    assert sum(entry["steps_measured"] for entry in record["epochs"]) == record["steps_measured"]


# A keras-hub task preprocesses its data in fit, and a lookup layer's
# vocabulary is no weight: explain feeds the one, its one-replica copy
# carries the other.
@pytest.mark.parametrize("name", ["bert_classifier", "text_vectorization"])
def test_explain_splits_the_step_of_a_model_never_trained_and_leaves_it_as_it_was(strategy, name):
    _, make_data, _ = MODELS[name]
    model = build(name, strategy)
    before = [np.asarray(v.numpy()) for v in model.variables]

    result = keras_scaling.explain(
        model, distributed(make_data(), strategy), steps=4, rounds=2, verbose=False
    )

    assert not any("not measured" in note for note in result.verdict.notes), result
    after = [np.asarray(v.numpy()) for v in model.variables]
    assert len(after) == len(before)
    for value_before, value_after in zip(before, after):
        np.testing.assert_array_equal(value_before, value_after)
    assert int(model.optimizer.iterations.numpy()) == 0


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


class SigtermAt(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class StartStep(keras.callbacks.Callback):
    """Records the optimizer step training starts from (after a restore)."""

    step = None

    def on_train_begin(self, logs=None):
        self.step = int(self.model.optimizer.iterations.numpy())


def test_bert_resumed_mid_epoch_is_bitwise_equal_to_a_run_never_stopped(
    strategy, trained, tmp_path
):
    never_stopped = trained("bert_classifier")

    backup_dir = tmp_path / "backup"
    stopped = build("bert_classifier", strategy)
    with pytest.raises(SystemExit) as raised:
        stopped.fit(
            distributed(bert_data(), strategy),
            epochs=EPOCHS,
            verbose=0,
            callbacks=[SigtermAt(SIGTERM_AT_STEP), keras_scaling.BackupAndRestore(backup_dir)],
        )
    assert raised.value.code == EXIT_PREEMPTED
    header, _ = _backup.read(backup_dir)
    assert header["position"]["iterations"] == SIGTERM_AT_STEP + 1

    resumed = build("bert_classifier", strategy)
    start = StartStep()
    resumed.fit(
        distributed(bert_data(), strategy),
        epochs=EPOCHS,
        verbose=0,
        callbacks=[keras_scaling.BackupAndRestore(backup_dir), start],
    )

    assert start.step == SIGTERM_AT_STEP + 1
    assert int(resumed.optimizer.iterations.numpy()) == never_stopped.iterations
    values = variable_values(resumed)
    expected = variable_values(never_stopped.model)
    assert len(values) == len(expected)
    for index, (value, reference) in enumerate(zip(values, expected)):
        assert value.dtype == reference.dtype, index
        assert value.tobytes() == reference.tobytes(), f"variable {index} differs"
    # The weights the stopped run left differ: the resume trained the rest.
    assert any(a.tobytes() != b.tobytes() for a, b in zip(variable_values(stopped), expected))
