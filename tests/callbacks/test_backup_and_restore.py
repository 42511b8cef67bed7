"""BackupAndRestore: exact resume after SIGTERM, atomic saves, clear errors.

The resume tests run `tests/workers/backup_worker.py` in processes of their
own (2 logical CPUs each): one run never stopped, runs that send themselves
SIGTERM after a chosen optimizer step, and the same arguments again, which
resume. Starting TensorFlow costs seconds of CPU time, so two processes
train them all, one after the other (`--then`): the first ends with the
`main` run stopped (exit status 75), which the second process resumes;
the other stopped runs go on in the first process
(`--preempted-continues`), each resumed there on a model and data built
anew. The other tests train in this process on one device.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import time
import types

import keras
import numpy as np
import pytest

import keras_scaling
from keras_scaling.internals import _probes
from keras_scaling.preemption import _backup
from keras_scaling.preemption.backup_and_restore import EXIT_PREEMPTED
from keras_scaling.summaries import _tensorboard

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "workers", "backup_worker.py")
RUN_TIMEOUT_S = 240
# Where the worker's stderr says a training begins (backup_worker.RUN_MARK),
# and the status of a preempted run that the next one followed (STOP_MARK).
RUN_MARK = "backup_worker: run "
STOP_MARK = "backup_worker: stopped with status "

# 640 samples, 8 per replica on 2 replicas: 40 steps per epoch, 120 in all.
STEPS_PER_EPOCH = 40
TOTAL_STEPS = 120
# The fixture's nine trainings, each within RUN_TIMEOUT_S, and a test's own reading.
CHAIN_TIMEOUT_S = 9 * RUN_TIMEOUT_S + 60


def run_args(directory, name, *extra, backup="backup"):
    """The worker's arguments for one training writing `directory/name.npz`."""
    return [
        "--backup-dir",
        str(directory / backup),
        "--out",
        str(directory / f"{name}.npz"),
        *extra,
    ]


def run_chain(*runs):
    """Runs the trainings `runs` (lists of arguments) in turn in one worker process.

    Returns one result per training, with its `returncode` (for those the
    next one followed, the status the worker said they stopped with, else 0;
    the process's status for the last) and its `stderr`.
    """
    command = [sys.executable, WORKER]
    for number, run in enumerate(runs):
        command += ["--then"] * (number > 0) + run
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=len(runs) * RUN_TIMEOUT_S, env=env
    )
    parts = result.stderr.split(RUN_MARK)
    parts = [parts[0] + parts[1], *parts[2:]] if len(parts) > 1 else parts
    if len(parts) < len(runs):
        pytest.fail(
            f"the worker stopped before training {len(runs)} times:\n{result.stderr[-3000:]}"
        )

    def status(number, part):
        if number == len(runs) - 1:
            return result.returncode
        stopped = part.split(STOP_MARK)
        return int(stopped[1].split()[0]) if len(stopped) > 1 else 0

    return [
        types.SimpleNamespace(returncode=status(number, part), stderr=part)
        for number, part in enumerate(parts)
    ]


def load_result(out):
    with np.load(out) as arrays:
        values = [arrays[name] for name in arrays.files]
    with open(f"{out}.json") as file:
        return values, json.load(file)["iterations"]


def start_iterations(out):
    with open(f"{out}.json") as file:
        return json.load(file)["start_iterations"]


def assert_bitwise_equal(values, reference):
    assert len(values) == len(reference)
    for index, (value, expected) in enumerate(zip(values, reference)):
        assert value.dtype == expected.dtype, index
        assert value.tobytes() == expected.tobytes(), f"variable {index} differs"


@pytest.fixture(scope="module")
def stopped_and_resumed(tmp_path_factory):
    """A run never stopped, and runs stopped by SIGTERM then resumed, each in a directory.

    `main`: stopped after step 50 and resumed, both logging with
    ThroughputLogger and ReplicaSyncCheck, as the run never stopped does; the
    backup it left is read before the resumed run deletes it. `advice`: the
    same with a baseline far above what 2 CPU replicas reach, so that the
    low-efficiency advice times the input pipeline in the first epoch of each
    run. `steps_per_execution`: four steps per call, stopped after step 52.
    `arrays`: other data (NumPy arrays, whose position is not saved). The
    first process trains the run never stopped, then each variant but `main`
    stopped and resumed, then `main` stopped, which ends it; the second
    process resumes `main`.
    """
    root = tmp_path_factory.mktemp("stopped_and_resumed")
    variants = {
        "advice": ["--log-dir", str(root / "advice" / "logs"), "--baseline", "1e9"],
        "steps_per_execution": ["--steps-per-execution", "4"],
        "arrays": ["--data", "arrays"],
        "main": ["--log-dir", str(root / "main" / "logs")],
    }
    sigterm_at = {"main": 50, "advice": 50, "steps_per_execution": 52, "arrays": 50}
    chain = [
        [
            *run_args(root, "reference", backup="reference_backup"),
            *["--log-dir", str(root / "reference_logs")],
        ]
    ]
    for name, extra in variants.items():
        directory = root / name
        directory.mkdir()
        resumed = run_args(directory, "resumed", *extra)
        stopped = [*resumed, "--sigterm-at", str(sigterm_at[name])]
        if name == "main":
            chain.append(stopped)
            main_resumed = resumed
        else:
            chain += [[*stopped, "--preempted-continues"], resumed]
    first = run_chain(*chain)
    runs = {"reference_out": root / "reference.npz", "reference": first[0]}
    for number, name in enumerate(variants):
        runs[name] = types.SimpleNamespace(stopped=first[1 + 2 * number])
        if name != "main":
            runs[name].resumed = first[2 + 2 * number]
    runs["main_header"], _ = _backup.read(root / "main" / "backup")
    (runs["main"].resumed,) = run_chain(main_resumed)
    return root, runs


def variant(stopped_and_resumed, name):
    """The stopped and the resumed run of variant `name`, and the resumed run's output file."""
    root, runs = stopped_and_resumed
    stopped, resumed = runs[name].stopped, runs[name].resumed
    assert stopped.returncode == EXIT_PREEMPTED, stopped.stderr[-3000:]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return stopped, resumed, root / name / "resumed.npz"


@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_sigterm_mid_epoch_then_resume_is_bitwise_identical_to_a_run_never_stopped(
    stopped_and_resumed,
):
    # Step 50 is step 10 of the second epoch.
    _, _, resumed_out = variant(stopped_and_resumed, "main")
    values, iterations = load_result(resumed_out)
    reference_values, reference_iterations = load_result(stopped_and_resumed[1]["reference_out"])
    assert start_iterations(resumed_out) == 51
    assert iterations == reference_iterations == TOTAL_STEPS
    assert_bitwise_equal(values, reference_values)


@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_resume_is_bitwise_identical_when_the_advice_times_the_input(stopped_and_resumed):
    # The reference is the run never stopped, whose advice timed nothing.
    _, _, resumed_out = variant(stopped_and_resumed, "advice")
    reference_out = stopped_and_resumed[1]["reference_out"]

    values, iterations = load_result(resumed_out)
    reference_values, reference_iterations = load_result(reference_out)
    with open(f"{resumed_out}.json") as file:
        assert json.load(file)["input_timing_calls"] >= 1
    with open(f"{reference_out}.json") as file:
        assert json.load(file)["input_timing_calls"] == 0
    assert iterations == reference_iterations == TOTAL_STEPS
    assert_bitwise_equal(values, reference_values)


@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_resume_is_bitwise_identical_with_steps_per_execution(stopped_and_resumed):
    # Four steps per call train the same steps as one: the reference is the
    # run never stopped, at one step per call.
    _, _, resumed_out = variant(stopped_and_resumed, "steps_per_execution")

    values, iterations = load_result(resumed_out)
    reference_values, reference_iterations = load_result(stopped_and_resumed[1]["reference_out"])
    # Signalled after the call that ended at step 52: saved after the next call.
    assert start_iterations(resumed_out) == 56
    assert iterations == reference_iterations == TOTAL_STEPS
    assert_bitwise_equal(values, reference_values)


@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_preempted_run_exits_75_and_leaves_a_backup_at_the_end_of_the_step_in_progress(
    stopped_and_resumed,
):
    stopped, _, _ = variant(stopped_and_resumed, "main")
    header = stopped_and_resumed[1]["main_header"]

    assert stopped.returncode == EXIT_PREEMPTED == 75
    assert header["reason"] == "preemption"
    # Signalled after step 50: saved at the end of the step in progress.
    assert header["position"]["iterations"] == 51
    assert header["position"]["epoch"] == 1
    assert header["position"]["step_in_epoch"] == 51 - STEPS_PER_EPOCH
    assert "Preemption notice (SIGTERM)" in stopped.stderr


@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_a_resume_says_once_at_the_default_log_level_where_it_resumed(stopped_and_resumed):
    # The worker configures no logging: what it prints, a user sees.
    stopped, resumed, resumed_out = variant(stopped_and_resumed, "main")
    stderr = resumed.stderr
    backup_file = os.path.join(os.path.dirname(resumed_out), "backup", "backup.npz")
    assert stderr.count("BackupAndRestore: resuming from") == 1, stderr[-3000:]
    assert (
        f"BackupAndRestore: resuming from {backup_file} (saved at optimizer step 51): "
        f"epoch 2/3, after its step 11 of {STEPS_PER_EPOCH}." in stderr
    )
    assert "resuming from" not in stopped.stderr


@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_other_data_resumes_at_the_start_of_the_saved_epoch_and_says_so(stopped_and_resumed):
    _, resumed, resumed_out = variant(stopped_and_resumed, "arrays")

    _, iterations = load_result(resumed_out)
    # Saved after step 51: the second epoch's 11 steps before it are trained again.
    assert iterations == TOTAL_STEPS + 11
    assert resumed.stderr.count("resuming at the start of epoch 2") == 1
    assert resumed.stderr.count("BackupAndRestore: resuming from") == 1
    assert "epoch 2/3, after its step 0 of 40." in resumed.stderr


def _scalar_steps(log_dir, tag):
    points = _tensorboard.read_scalars(_tensorboard.run_dir(log_dir))
    return [step for step, _ in points.get(tag, [])]


@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_replica_sync_check_and_throughput_logger_continue_across_a_resume(stopped_and_resumed):
    _, resumed, _ = variant(stopped_and_resumed, "main")
    log_dir = stopped_and_resumed[0] / "main" / "logs"

    throughput_steps = _scalar_steps(log_dir, "throughput/samples_per_sec")
    sync_steps = _scalar_steps(log_dir, "replica_sync/max_abs_diff")
    for steps in (throughput_steps, sync_steps):
        assert steps, "nothing was written"
        assert len(steps) == len(set(steps)), f"a step was written twice: {steps}"
        assert max(steps) > 50, f"the resumed run wrote nothing: {steps}"
    assert "diverged" not in resumed.stderr


# In this process: one device, the default strategy.


def _model(units=4, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def _data(global_batch_size=8, num_examples=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_examples, 3)).astype("float32")
    return keras_scaling.data.distribute(
        (x, x.sum(axis=1, keepdims=True)), global_batch_size=global_batch_size
    )


@pytest.fixture(scope="module")
def one_epoch_backup(tmp_path_factory):
    """The bytes of the backup one epoch of `_model()` on `_data()` leaves."""
    backup_dir = tmp_path_factory.mktemp("one_epoch")
    _model().fit(
        _data(),
        epochs=1,
        verbose=0,
        callbacks=[keras_scaling.BackupAndRestore(backup_dir, delete_checkpoint=False)],
    )
    with open(_backup.backup_path(backup_dir), "rb") as file:
        return file.read()


@pytest.fixture
def backup_of_one_epoch(one_epoch_backup, tmp_path):
    """That backup, copied into `tmp_path`: one fit serves every test that resumes from it."""
    with open(_backup.backup_path(tmp_path), "wb") as file:
        file.write(one_epoch_backup)
    return one_epoch_backup


def _fit_resuming(model, data, backup_dir):
    model.fit(data, epochs=2, verbose=0, callbacks=[keras_scaling.BackupAndRestore(backup_dir)])


def test_backup_of_another_model_raises_naming_the_directory_and_overwrites_nothing(
    tmp_path, backup_of_one_epoch
):
    saved = backup_of_one_epoch

    with pytest.raises(ValueError, match="another model") as raised:
        _fit_resuming(_model(units=5), _data(), tmp_path)

    assert str(tmp_path) in str(raised.value)
    assert "shape [3, 4] in the backup, [3, 5] here" in str(raised.value)
    assert open(_backup.backup_path(tmp_path), "rb").read() == saved


def test_backup_of_another_global_batch_raises_and_overwrites_nothing(
    tmp_path, backup_of_one_epoch
):
    saved = backup_of_one_epoch

    with pytest.raises(ValueError, match="another data plan") as raised:
        _fit_resuming(_model(), _data(global_batch_size=16), tmp_path)

    assert "global_batch_size 8 in the backup, 16 here" in str(raised.value)
    assert open(_backup.backup_path(tmp_path), "rb").read() == saved


def test_corrupt_backup_raises_naming_the_file_and_overwrites_nothing(tmp_path):
    path = _backup.backup_path(tmp_path)
    with open(path, "wb") as file:
        file.write(b"not a backup")

    with pytest.raises(ValueError, match="corrupt") as raised:
        _fit_resuming(_model(), _data(), tmp_path)

    assert path in str(raised.value)
    assert open(path, "rb").read() == b"not a backup"


def test_training_to_the_end_deletes_the_backup(tmp_path, backup_of_one_epoch):
    _fit_resuming(_model(), _data(), tmp_path)

    assert not os.path.exists(_backup.backup_path(tmp_path))


def test_a_resume_with_every_epoch_trained_says_so(tmp_path, caplog, backup_of_one_epoch):
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        _model().fit(
            _data(), epochs=1, verbose=0, callbacks=[keras_scaling.BackupAndRestore(tmp_path)]
        )

    path = _backup.backup_path(tmp_path)
    expected = f"BackupAndRestore: resuming from {path} (saved at optimizer step 8): nothing left to train (epochs=1)."
    assert caplog.text.count("BackupAndRestore: resuming from") == 1
    assert expected in caplog.text


def test_resume_at_an_epoch_boundary_continues_with_the_next_epoch(tmp_path, backup_of_one_epoch):
    model = _model()

    _fit_resuming(model, _data(), tmp_path)

    # 64 samples in batches of 8: the second epoch's 8 steps after the first's 8.
    assert int(model.optimizer.iterations.numpy()) == 16


def test_save_every_n_steps_saves_at_the_first_batch_end_past_each_multiple(tmp_path):
    seen = []

    class ReadBackup(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            backup = _backup.read(tmp_path)
            seen.append(None if backup is None else backup[0]["position"]["iterations"])

    _model().fit(
        _data(),
        epochs=1,
        verbose=0,
        callbacks=[
            keras_scaling.BackupAndRestore(tmp_path, save_every_n_steps=3, delete_checkpoint=False),
            ReadBackup(),
        ],
    )

    assert seen == [None, None, 3, 3, 3, 6, 6, 6]


def _data_pass_saved_mid_epoch(backup_dir):
    _model().fit(
        _data(),
        epochs=1,
        verbose=0,
        callbacks=[
            keras_scaling.BackupAndRestore(
                backup_dir, save_every_n_steps=3, delete_checkpoint=False
            )
        ],
    )
    return _backup.read(backup_dir)[0]["position"]["data_pass"]


def test_without_the_iterator_dataset_probe_a_backup_resumes_at_its_epoch_start(
    tmp_path, monkeypatch, caplog
):
    assert isinstance(_data_pass_saved_mid_epoch(tmp_path / "healthy"), int)
    probe = _probes._registry["tf.distribute.iterator_dataset"]
    _probes._warned.clear()
    monkeypatch.setenv(_probes.FAIL_PROBES_ENV, probe.name)
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        saved = _data_pass_saved_mid_epoch(tmp_path / "degraded")
        _data_pass_saved_mid_epoch(tmp_path / "again")
    monkeypatch.delenv(_probes.FAIL_PROBES_ENV)
    _probes._warned.clear()

    # No pass over the data is known: a resume starts the saved epoch over.
    assert saved is None
    warnings = [r.getMessage() for r in caplog.records if probe.reaches in r.getMessage()]
    assert len(warnings) == 1
    assert "exact resume" in probe.lost
    assert probe.lost in warnings[0] and keras.__version__ in warnings[0]


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"backup_dir": None}, TypeError, "backup_dir must be a directory path"),
        ({"backup_dir": ""}, TypeError, "backup_dir must be a directory path"),
        ({"backup_dir": "b", "save_every_n_steps": 0}, ValueError, "got 0"),
        ({"backup_dir": "b", "save_every_n_steps": 2.5}, TypeError, "save_every_n_steps"),
        ({"backup_dir": "b", "save_on_preemption": "yes"}, TypeError, "save_on_preemption"),
    ],
)
def test_bad_arguments_raise_naming_the_parameter(kwargs, error, fragment):
    backup_dir = kwargs.pop("backup_dir")
    with pytest.raises(error, match=fragment):
        keras_scaling.BackupAndRestore(backup_dir, **kwargs)


_SLOW_SAVER = """
import sys
import numpy as np
from keras_scaling.preemption import _backup
big = np.ones((64, 1024, 1024), np.float32)   # 256 MB: the save takes a while
spec = _backup.variable_spec("big", big.shape, "float32")
_backup.write(sys.argv[1], values=[big], specs=[spec], header={"position": {"iterations": 2}})
"""


@pytest.mark.timeout(120)
def test_a_process_killed_during_a_save_leaves_the_previous_backup_usable(tmp_path):
    previous = np.arange(6, dtype=np.float32).reshape(2, 3)
    spec = _backup.variable_spec("big", previous.shape, "float32")
    _backup.write(tmp_path, values=[previous], specs=[spec], header={"position": {"iterations": 1}})
    saver = subprocess.Popen([sys.executable, "-c", _SLOW_SAVER, str(tmp_path)])
    try:
        deadline = time.monotonic() + 60
        while not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]:
            assert time.monotonic() < deadline, "the save never started"
            assert saver.poll() is None, "the save ended before it could be killed"
            time.sleep(0.01)
        saver.send_signal(signal.SIGKILL)
    finally:
        saver.kill()
        saver.wait()

    header, raw_values = _backup.read(tmp_path)
    assert header["position"]["iterations"] == 1
    restored = _backup.decode(raw_values[0], header["variables"][0], np.float32)
    assert np.array_equal(restored, previous)
    _backup.remove_temporary_files(tmp_path)
    assert os.listdir(tmp_path) == [_backup.FILE_NAME]


def test_save_is_due_counts_multiples_of_optimizer_steps():
    assert not _backup.save_is_due(99, 0, 100)
    assert _backup.save_is_due(100, 0, 100)
    assert _backup.save_is_due(104, 96, 100)  # steps_per_execution=8 jumps past 100
    assert not _backup.save_is_due(150, 100, 100)
    assert not _backup.save_is_due(500, 0, None)


def test_variable_differences_name_index_path_and_what_differs():
    saved = [_backup.variable_spec("dense/kernel", (8, 4), "float32")]
    current = [
        _backup.variable_spec("dense_1/kernel", (8, 4), "float16"),
        _backup.variable_spec("dense_1/bias", (4,), "float32"),
    ]

    assert _backup.variable_differences(saved, current) == [
        "1 variables in the backup, 2 here",
        "variable 0 (dense_1/kernel): dtype float32 in the backup, float16 here",
    ]
    assert _backup.variable_differences(saved, saved) == []


class _SigtermAtStep(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_during_fit_saves_then_fit_raises_system_exit_75(tmp_path):
    with pytest.raises(SystemExit) as raised:
        _model().fit(
            _data(),
            epochs=2,
            verbose=0,
            callbacks=[_SigtermAtStep(3), keras_scaling.BackupAndRestore(tmp_path)],
        )

    assert raised.value.code == EXIT_PREEMPTED
    header, _ = _backup.read(tmp_path)
    assert header["reason"] == "preemption"
    assert header["position"]["iterations"] == 4  # the step in progress finished


def test_the_previous_sigterm_handler_is_back_after_fit(tmp_path):
    def previous_handler(signum, frame):
        pass

    original = signal.signal(signal.SIGTERM, previous_handler)
    try:
        _model().fit(
            _data(), epochs=1, verbose=0, callbacks=[keras_scaling.BackupAndRestore(tmp_path)]
        )
        assert signal.getsignal(signal.SIGTERM) is previous_handler
    finally:
        signal.signal(signal.SIGTERM, original)


class _CountSamples(keras.layers.Layer):
    """Counts, in a weight the backup holds, the training steps each sample (id in column 0) was in."""

    def __init__(self, num_examples, **kwargs):
        super().__init__(**kwargs)
        self.num_examples = num_examples

    def build(self, input_shape):
        self.counts = self.add_weight(
            shape=(self.num_examples,), initializer="zeros", trainable=False, name="counts"
        )

    def call(self, inputs, training=False):
        if training:
            ids = keras.ops.cast(inputs[:, 0], "int32")
            self.counts.assign_add(
                keras.ops.cast(keras.ops.bincount(ids, minlength=self.num_examples), "float32")
            )
        return inputs


def _counting_model_and_data(num_examples=64, steps_per_execution=1, shuffle=True):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(1)(_CountSamples(num_examples)(inputs))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="mse", steps_per_execution=steps_per_execution)
    x = np.random.default_rng(0).normal(size=(num_examples, 3)).astype("float32")
    x[:, 0] = np.arange(num_examples)
    data = keras_scaling.data.distribute(
        (x, x[:, 1:].sum(axis=1)), global_batch_size=8, shuffle=shuffle
    )
    return model, data


class _BatchesOfEachEpoch(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = {}

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.batches.setdefault(self.epoch, []).append(batch)


@pytest.fixture(scope="module")
def preempted_at_step_4_of_epoch_2(tmp_path_factory):
    """`copy(backup_dir, shuffle=True)`: writes there the backup a preempted fit left.

    64 samples in batches of 8: 8 steps per epoch. SIGTERM after optimizer
    step 11: the backup is saved at the end of the step in progress, step 12.
    The backup holds no epoch count: one fit of 3 epochs serves resumes of 2
    or 3. One fit per order of the data, in the first test that needs it.
    """
    saved = {}

    def copy(backup_dir, shuffle=True):
        if shuffle not in saved:
            stopped_dir = tmp_path_factory.mktemp("preempted")
            model, data = _counting_model_and_data(shuffle=shuffle)
            with pytest.raises(SystemExit):
                model.fit(
                    data,
                    epochs=3,
                    verbose=0,
                    callbacks=[_SigtermAtStep(11), keras_scaling.BackupAndRestore(stopped_dir)],
                )
            with open(_backup.backup_path(stopped_dir), "rb") as file:
                saved[shuffle] = file.read()
        with open(_backup.backup_path(backup_dir), "wb") as file:
            file.write(saved[shuffle])
        assert _backup.read(backup_dir)[0]["position"]["step_in_epoch"] == 4

    return copy


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in order"])
def test_a_resumed_epoch_keeps_its_length_and_trains_every_other_sample_once(
    tmp_path, shuffle, preempted_at_step_4_of_epoch_2
):
    preempted_at_step_4_of_epoch_2(tmp_path, shuffle=shuffle)

    # A new process would build both again.
    model, data = _counting_model_and_data(shuffle=shuffle)
    batches = _BatchesOfEachEpoch()
    model.fit(
        data, epochs=3, verbose=0, callbacks=[keras_scaling.BackupAndRestore(tmp_path), batches]
    )

    counts = model.layers[1].counts.numpy()
    assert counts.tolist() == [3.0] * 64, "a sample was trained twice or left out"
    assert int(model.optimizer.iterations.numpy()) == 24
    # Keras counts every step of the resumed epoch: the first 4 read, not trained.
    assert batches.batches == {1: list(range(8)), 2: list(range(8))}


def test_batches_read_outside_fit_before_the_resume_change_no_sample_it_trains(
    tmp_path, preempted_at_step_4_of_epoch_2
):
    preempted_at_step_4_of_epoch_2(tmp_path)

    model, data = _counting_model_and_data()
    # A look at the data before training, as people do to check shapes.
    next(iter(data))
    for _ in data.take(3):
        pass
    model.fit(data, epochs=3, verbose=0, callbacks=[keras_scaling.BackupAndRestore(tmp_path)])

    counts = model.layers[1].counts.numpy()
    assert counts.tolist() == [3.0] * 64, "a sample was trained twice or left out"


def test_a_backup_inside_an_execution_of_the_new_steps_per_execution_retrains_the_rest_and_says_so(
    tmp_path, caplog, preempted_at_step_4_of_epoch_2
):
    preempted_at_step_4_of_epoch_2(tmp_path)

    # With 3 steps per call, 3 of the 4 trained steps are skipped and 1 trained again.
    model, data = _counting_model_and_data(steps_per_execution=3)
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        model.fit(data, epochs=2, verbose=0, callbacks=[keras_scaling.BackupAndRestore(tmp_path)])

    assert "its last 1 steps are trained again" in caplog.text
    assert int(model.optimizer.iterations.numpy()) == 17
    counts = model.layers[1].counts.numpy()
    assert sorted(set(counts.tolist())) == [2.0, 3.0] and counts.sum() == 17 * 8


def test_no_module_of_the_package_reads_stack_frames():
    import pathlib

    package = pathlib.Path(keras_scaling.__file__).parent
    readers = ("_getframe", "f_locals", "f_back", "currentframe", "inspect.stack")
    found = [
        f"{path.relative_to(package)}: {reader}"
        for path in sorted(package.rglob("*.py"))
        for reader in readers
        if reader in path.read_text()
    ]
    assert found == []
