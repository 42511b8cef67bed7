"""The hook around a model's train function that replaces batch hooks."""

import types

import keras
import pytest
import tensorflow as tf

import keras_scaling
from keras_scaling.fit_hooks import _train_function_hook
from keras_scaling.fit_hooks._train_function_hook import TrainFunctionHook


def _model_with(function):
    """What the hook touches of a model: its `train_function` attribute."""
    return types.SimpleNamespace(train_function=function)


def _keras_train_function(iterator):
    return {"loss": next(iterator)}


def _recording_hook(model, events, name, **kwargs):
    return TrainFunctionHook(model, after=lambda: events.append(name), **kwargs)


def _bench_progress_class():
    from keras_scaling.cli import _bench_worker

    return type(_bench_worker._progress_callback(100))


@pytest.mark.parametrize(
    "callback_class",
    [
        lambda: keras_scaling.ThroughputLogger,
        lambda: keras_scaling.ReplicaSyncCheck,
        lambda: keras_scaling.BackupAndRestore,
        _bench_progress_class,
    ],
    ids=["ThroughputLogger", "ReplicaSyncCheck", "BackupAndRestore", "bench progress"],
)
def test_callbacks_leave_keras_batch_hooks_alone(callback_class):
    # A batch hook of any callback makes Keras convert every step's logs in
    # fit's loop, waiting for each step before dispatching the next.
    callback_class = callback_class()
    for hook in ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end"):
        assert getattr(callback_class, hook) is getattr(keras.callbacks.Callback, hook), hook


def test_after_runs_once_per_call_and_before_sees_the_iterator():
    events, seen = [], []
    model = _model_with(_keras_train_function)
    hook = TrainFunctionHook(model, after=lambda: events.append("after"), before=seen.append)
    hook.attach()
    hook.attach()  # attaching twice wraps once
    iterator = iter([1.0, 2.0])
    assert model.train_function(iterator) == {"loss": 1.0}
    assert model.train_function(iterator) == {"loss": 2.0}
    assert events == ["after", "after"]
    assert seen == [iterator, iterator]
    hook.detach()
    assert model.train_function is _keras_train_function


def test_before_can_be_switched_off_and_on_while_attached():
    seen = []
    model = _model_with(_keras_train_function)
    hook = TrainFunctionHook(model, after=lambda: None, before=seen.append)
    hook.attach()
    first, second, third = iter([1.0]), iter([2.0]), iter([3.0])
    model.train_function(first)
    hook.before = None
    model.train_function(second)
    hook.before = seen.append
    model.train_function(third)
    assert seen == [first, third]


def _skipping(calls):
    """A `skip` that reads one batch and trains nothing in each of the first `calls` calls."""
    remaining = [calls]

    def skip(iterator):
        if not remaining[0]:
            return None
        remaining[0] -= 1
        next(iterator)  # read, not trained
        return {"loss": 0.0}

    return skip


def test_a_skipped_call_trains_nothing_and_returns_the_skip_logs():
    events = []
    model = _model_with(_keras_train_function)
    hook = TrainFunctionHook(model, after=lambda: events.append("after"))
    hook.attach()
    hook.skip = _skipping(2)
    iterator = iter([1.0, 2.0, 3.0])
    results = [model.train_function(iterator) for _ in range(3)]

    assert results == [{"loss": 0.0}, {"loss": 0.0}, {"loss": 3.0}]
    assert events == ["after"]


@pytest.mark.parametrize("skipping", ["inner", "outer"])
def test_no_hook_counts_a_call_skipped_by_another(skipping):
    # BackupAndRestore's skipped steps are not steps ThroughputLogger may time,
    # whichever of the two wrapped the train function first.
    events = []
    model = _model_with(_keras_train_function)
    inner = _recording_hook(model, events, "inner")
    inner.attach()
    outer = _recording_hook(model, events, "outer")
    outer.attach()
    (inner if skipping == "inner" else outer).skip = _skipping(1)
    iterator = iter([1.0, 2.0])
    results = [model.train_function(iterator) for _ in range(2)]

    assert results == [{"loss": 0.0}, {"loss": 2.0}]
    assert events == ["inner", "outer"]  # the trained call only


def test_errors_are_reported_but_the_end_of_the_data_is_not():
    errors = []
    model = _model_with(_keras_train_function)
    TrainFunctionHook(model, after=lambda: None, on_error=lambda: errors.append(1)).attach()
    with pytest.raises(StopIteration):
        model.train_function(iter([]))
    with pytest.raises(tf.errors.OutOfRangeError):
        model.train_function(_raising(tf.errors.OutOfRangeError(None, None, "end")))
    assert errors == []
    with pytest.raises(ValueError, match="bad step"):
        model.train_function(_raising(ValueError("bad step")))
    assert errors == [1]


def _raising(error):
    def generator():
        raise error
        yield

    return generator()


def test_a_hook_detached_under_another_passes_through_until_it_can_be_removed():
    events = []
    model = _model_with(_keras_train_function)
    lower = _recording_hook(model, events, "lower")
    upper = _recording_hook(model, events, "upper")
    lower.attach()
    upper.attach()
    lower.detach()  # covered by `upper`: stays, doing nothing
    model.train_function(iter([1.0]))
    assert events == ["upper"]
    upper.detach()  # both go
    assert model.train_function is _keras_train_function
    model.train_function(iter([1.0]))
    assert events == ["upper"]


def test_a_rebuilt_train_function_is_wrapped_again():
    events = []
    model = _model_with(_keras_train_function)
    hook = _recording_hook(model, events, "hook")
    hook.attach()
    model.train_function = _keras_train_function  # as Keras does after compile
    hook.attach()
    model.train_function(iter([1.0]))
    assert events == ["hook"]


def test_a_hook_left_by_a_fit_that_raised_is_abandoned_by_the_next_fit():
    events, abandoned = [], []
    model = _model_with(_keras_train_function)
    first_fit, second_fit = {}, {}
    left_over = _recording_hook(
        model, events, "left over", owner=first_fit, on_abandoned=lambda: abandoned.append(1)
    )
    same_fit = _recording_hook(model, events, "same fit", owner=first_fit)
    left_over.attach()
    same_fit.attach()
    assert abandoned == []  # hooks of one fit leave each other alone
    _train_function_hook.abandon_other_fits(model, second_fit)
    assert abandoned == [1]
    model.train_function(iter([1.0]))
    assert events == []  # both belonged to the first fit
