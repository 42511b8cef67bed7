"""What the callbacks change in the process is undone when `fit` ends, however it ends.

`BackupAndRestore` installs a SIGTERM handler and wraps the train function;
`ThroughputLogger` wraps it too and makes `model.train_step` count its
traces. Keras calls `on_train_end` only when `fit` returns. Each way a `fit`
can end is tried here with both callbacks, on one device: a return, a step
that raises, Ctrl-C inside a step, another callback raising between steps,
and a `fit` left with its exception kept alive (as a notebook keeps the last
one), which the next `fit` ends. No garbage collection is needed.
"""

import signal

import keras
import numpy as np
import pytest

import keras_scaling


def _model(run_eagerly=False, fail_at_step=None, failure=ValueError):
    keras.utils.set_random_seed(0)

    class Model(keras.Sequential):
        steps = 0

        def train_step(self, data):
            Model.steps += 1
            if fail_at_step is not None and Model.steps == fail_at_step:
                raise failure("a failure inside the step")
            return super().train_step(data)

    model = Model([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", run_eagerly=run_eagerly)
    return model


def _data():
    x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    return keras_scaling.data.distribute((x, x.sum(axis=1, keepdims=True)), global_batch_size=8)


def _callbacks(tmp_path):
    return [
        keras_scaling.BackupAndRestore(tmp_path / "backup"),
        keras_scaling.ThroughputLogger(tmp_path / "logs", warmup_steps=1, update_freq=2),
    ]


class _RaiseAtEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise RuntimeError("another callback failed")


@pytest.fixture
def previous_sigterm_handler():
    received = []

    def handler(signum, frame):
        received.append(signum)

    original = signal.signal(signal.SIGTERM, handler)
    handler.received = received
    try:
        yield handler
    finally:
        signal.signal(signal.SIGTERM, original)


def assert_process_as_before(model, handler):
    assert signal.getsignal(signal.SIGTERM) is handler
    assert "train_step" not in vars(model)
    assert not hasattr(model.train_function, "_keras_scaling_original")


def test_a_fit_that_returns_leaves_the_process_as_it_was(tmp_path, previous_sigterm_handler):
    model = _model()
    model.fit(_data(), epochs=2, verbose=0, callbacks=_callbacks(tmp_path))

    assert_process_as_before(model, previous_sigterm_handler)


def test_a_step_that_raises_leaves_the_process_as_it_was(tmp_path, previous_sigterm_handler):
    model = _model(run_eagerly=True, fail_at_step=5)
    with pytest.raises(ValueError, match="a failure inside the step"):
        model.fit(_data(), epochs=2, verbose=0, callbacks=_callbacks(tmp_path))

    assert_process_as_before(model, previous_sigterm_handler)


def test_ctrl_c_inside_a_step_leaves_the_process_as_it_was(tmp_path, previous_sigterm_handler):
    model = _model(run_eagerly=True, fail_at_step=5, failure=KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        model.fit(_data(), epochs=2, verbose=0, callbacks=_callbacks(tmp_path))

    assert_process_as_before(model, previous_sigterm_handler)


def test_after_another_callback_raised_sigterm_reaches_the_previous_handler(
    tmp_path, previous_sigterm_handler
):
    model = _model()
    try:
        model.fit(
            _data(), epochs=2, verbose=0, callbacks=[*_callbacks(tmp_path), _RaiseAtEpochEnd()]
        )
    except RuntimeError:
        pass  # handled: fit is over, Keras skipped on_train_end

    signal.raise_signal(signal.SIGTERM)

    assert previous_sigterm_handler.received == [signal.SIGTERM]
    assert_process_as_before(model, previous_sigterm_handler)


def test_a_fit_left_with_its_exception_alive_is_ended_by_the_next_fit(
    tmp_path, previous_sigterm_handler
):
    abandoned = _model()
    with pytest.raises(RuntimeError) as kept:  # holds fit's frames, as a notebook does
        abandoned.fit(
            _data(), epochs=2, verbose=0, callbacks=[*_callbacks(tmp_path), _RaiseAtEpochEnd()]
        )
    seen_at_next_start = []

    class SeeTheProcess(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen_at_next_start.append("train_step" in vars(abandoned))

    other = _model()
    other.fit(
        _data(),
        epochs=1,
        verbose=0,
        callbacks=[*_callbacks(tmp_path / "next"), SeeTheProcess()],
    )

    assert kept.value is not None
    # The next fit's callbacks ended the abandoned fit before theirs began.
    assert seen_at_next_start == [False]
    assert_process_as_before(abandoned, previous_sigterm_handler)
    assert_process_as_before(other, previous_sigterm_handler)


def test_a_sigterm_handler_installed_after_a_failed_fit_is_kept(tmp_path, previous_sigterm_handler):
    failed = _model()
    try:
        failed.fit(
            _data(), epochs=2, verbose=0, callbacks=[*_callbacks(tmp_path), _RaiseAtEpochEnd()]
        )
    except RuntimeError:
        pass
    received = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    installed = signal.getsignal(signal.SIGTERM)

    # The next fit ends the failed one, installs its own handler and puts back the user's.
    other = _model()
    other.fit(_data(), epochs=1, verbose=0, callbacks=_callbacks(tmp_path / "next"))
    assert signal.getsignal(signal.SIGTERM) is installed
    signal.raise_signal(signal.SIGTERM)

    assert received == [signal.SIGTERM]
    assert previous_sigterm_handler.received == []
    assert "train_step" not in vars(failed)
