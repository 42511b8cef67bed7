"""keras-hub's BERT classifier stopped by SIGTERM mid-epoch and resumed by `BackupAndRestore`.

Three runs on 2 replicas of a MirroredStrategy, in this process, each on a
model and a `keras_scaling.data.distribute` dataset built anew, as a new
process would: one never stopped (with `ReplicaSyncCheck` and
`ThroughputLogger`), one that gets SIGTERM during the second epoch (saved at
the end of the step in progress; `fit` raises `SystemExit(75)`), and one that
resumes from its backup. The resumed run ends with every model and optimizer
variable bitwise equal to the run never stopped: the dropout seeds, Adam's
slots and the shuffled order of the resumed epoch included.
"""

import os
import signal

import keras
import pytest
import tensorflow as tf
from real_models_common import (
    EPOCHS,
    STEPS_PER_EPOCH,
    bert_data,
    build,
    distributed,
    train,
    variable_values,
)

import keras_scaling
from keras_scaling.preemption import _backup
from keras_scaling.preemption.backup_and_restore import EXIT_PREEMPTED

pytestmark = pytest.mark.logical_cpus(2)

MODEL = "bert_classifier"
# Step 3 of the second epoch; the backup is saved at the end of the step
# in progress.
SIGTERM_AT_STEP = STEPS_PER_EPOCH + 3


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


@pytest.fixture(scope="module")
def strategy():
    devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    assert len(devices) == 2
    return tf.distribute.MirroredStrategy(devices)


def test_bert_resumed_mid_epoch_is_bitwise_equal_to_a_run_never_stopped(strategy, tmp_path):
    never_stopped = train(
        MODEL,
        strategy,
        str(tmp_path / "logs"),
        callbacks=[keras_scaling.BackupAndRestore(tmp_path / "never_stopped_backup")],
    )

    backup_dir = tmp_path / "backup"
    stopped = build(MODEL, strategy)
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

    resumed = build(MODEL, strategy)
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
    # The stopped run's weights differ from both: the resume trained the rest.
    assert any(a.tobytes() != b.tobytes() for a, b in zip(variable_values(stopped), expected))
