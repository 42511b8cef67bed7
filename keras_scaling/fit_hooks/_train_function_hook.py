"""Per-step work in a wrapper of `model.train_function`, not in a batch hook.

A train batch hook makes Keras turn every step's logs into Python numbers,
waiting for each step before dispatching the next. Wrappers stack: a hook
detached under another wrapper passes calls through until the next `attach`
on that model removes it.
"""

import threading

import tensorflow as tf

from keras_scaling.fit_hooks import _step_counter

_HOOK = "_keras_scaling_hook"
_ORIGINAL = "_keras_scaling_original"

_call = threading.local()  # whether the innermost call on this thread was skipped


class TrainFunctionHook:
    """Wraps `model.train_function` so that `after()` runs after each call that trained.

    `before(iterator)` runs first; logs that `skip(iterator)` returns are the call's, which then
    trains nothing (nor runs any hook's `after`). `on_error()` runs when a call raises but at the
    data's end (Ctrl-C too); `on_abandoned()` when a `fit` of another `owner` (`params`) starts.
    """

    def __init__(
        self, model, *, after, before=None, skip=None, on_error=None, owner=None, on_abandoned=None
    ):
        self.model = model
        self._after = after
        self.before = before
        self.skip = skip
        self._on_error = on_error
        self.owner = owner
        self._on_abandoned = on_abandoned
        self._wrapper = None

    def attach(self):
        """Wraps the train function unless this hook wraps it already; again each epoch (`compile` rebuilds it)."""
        abandon_other_fits(self.model, self.owner)
        _remove_detached(self.model)
        original = self.model.train_function
        if original is None or self._wrapper in _chain(original):
            return
        hook = self
        unbuilt = _step_counter.unbuilt_held_optimizers(self.model)

        def train_function(iterator):
            if hook._wrapper is not train_function:
                return original(iterator)
            if hook.before is not None:
                hook.before(iterator)
            if hook.skip is not None:
                logs = hook.skip(iterator)
                if logs is not None:
                    _call.skipped = True
                    return logs
            _call.skipped = False
            try:
                logs = original(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                raise  # the end of the data
            except BaseException as error:
                _note_unbuilt(error, unbuilt)
                if hook._on_error is not None:
                    hook._on_error()
                raise
            if not _call.skipped:
                hook._after()
            return logs

        setattr(train_function, _HOOK, self)
        setattr(train_function, _ORIGINAL, original)
        self._wrapper = self.model.train_function = train_function

    def detach(self):
        """Stops the hook and unwraps what can be unwrapped."""
        self._wrapper = None
        _remove_detached(self.model)


def _note_unbuilt(error, unbuilt):
    """Names, on the error of a step that built them in its trace, the optimizers to build before `fit`."""
    if not unbuilt or "must feed a value for placeholder" not in str(error):
        return
    names = " and ".join(f"model.{name}" for name in unbuilt)
    note = (
        f"keras_scaling: {names} {'was' if len(unbuilt) == 1 else 'were'} not built before fit, "
        "so the step made their variables inside its trace, which fails under tf.distribute. "
        f"Build them first, in the strategy's scope: model.{unbuilt[0]}.build(<the variables it trains>)."
    )
    if note not in getattr(error, "__notes__", ()):
        error.add_note(note)


def _chain(function):
    while function is not None:
        yield function
        function = getattr(function, _ORIGINAL, None)


def _remove_detached(model):
    while (hook := getattr(model.train_function, _HOOK, None)) is not None:
        if hook._wrapper is model.train_function:
            return
        model.train_function = getattr(model.train_function, _ORIGINAL)


def abandon_other_fits(model, owner):
    """Stops the hooks on `model` of a `fit` other than `owner`'s, calling their `on_abandoned`."""
    if owner is None:
        return
    for function in list(_chain(model.train_function)):
        hook = getattr(function, _HOOK, None)
        if hook is not None and hook._wrapper is function and hook.owner is not owner:
            hook._wrapper = None
            if hook._on_abandoned is not None:
                hook._on_abandoned()


def execution_callback(after_execution):
    """A Keras callback that calls `after_execution(model)` after each call of the train function."""
    import keras

    class ExecutionCallback(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self._hook = TrainFunctionHook(
                self.model, after=lambda: after_execution(self.model), owner=self.params
            )
            self._hook.attach()

        def on_train_end(self, logs=None):
            self._hook.detach()

    return ExecutionCallback()
