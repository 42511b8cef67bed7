"""Work done after each call of a model's train function, on `fit`'s own thread.

A callback that defines a train batch hook (`on_train_batch_end` or
`on_batch_end`) makes Keras run every callback's batch hooks in `fit`'s loop
instead of a thread of their own, and turn each step's logs into Python
numbers there, which waits for the step to finish before the next is
dispatched. keras_scaling's callbacks define no batch hook: they wrap
`model.train_function`, which `fit` calls once per execution
(`steps_per_execution` steps), and do their per-step work in the wrapper.

Wrappers stack: several callbacks (and a callback of an earlier `fit` that
ended by an exception) may each have wrapped the function. A hook that is
detached while another wrapper sits on top of it stays in place as a
pass-through, and is removed by the next hook attached to that model.
A call that a hook skips trains nothing, so no hook wrapped around it runs
its `after` either, whatever order the hooks were attached in.
"""

import threading

import tensorflow as tf

_HOOK = "_keras_scaling_hook"
_ORIGINAL = "_keras_scaling_original"

# Whether the innermost call returned on this thread was skipped.
_call = threading.local()


class TrainFunctionHook:
    """Wraps `model.train_function` so that `after()` runs after each call.

    Args:
        model: the Keras model.
        after: callable without arguments, run after each call that returned.
        before: callable taking the call's iterator, run before each call, or
            None. It is the attribute `before`, which may be set (to None
            too) while the hook is attached.
        skip: callable taking the call's iterator, run after `before`: when
            it returns logs, the call trains nothing (the train function is
            not called, nor the `after` of this or any hook around it) and
            returns them; when it returns None, the call trains. None for no
            skipping. It is the attribute `skip`, which may be set while the
            hook is attached.
        on_error: callable without arguments, run when a call raises anything
            but the end of the data (Ctrl-C included), or None.
        owner: the fit that attached the hook (the `params` dict its callbacks
            share): an attached hook of another fit of the same model is left
            over from a fit that raised, and `on_abandoned` is called for it.
        on_abandoned: callable without arguments, or None.
    """

    def __init__(
        self,
        model,
        *,
        after,
        before=None,
        skip=None,
        on_error=None,
        owner=None,
        on_abandoned=None,
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
        """Wraps the model's train function, unless this hook already wraps it.

        Call it again whenever the function may have been rebuilt (each
        epoch): Keras makes a new one after `compile`.
        """
        abandon_other_fits(self.model, self.owner)
        _remove_detached(self.model)
        original = self.model.train_function
        if original is None or self._wrapper in _chain(original):
            return
        self._deactivate()
        hook = self

        def train_function(iterator):
            if hook._wrapper is not train_function:
                return original(iterator)
            before = hook.before
            if before is not None:
                before(iterator)
            skip = hook.skip
            if skip is not None:
                skipped_logs = skip(iterator)
                if skipped_logs is not None:
                    _call.skipped = True
                    return skipped_logs
            try:
                _call.skipped = False
                logs = original(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                raise  # the end of the data, not a failure
            except BaseException:
                if hook._on_error is not None:
                    hook._on_error()
                raise
            if not _call.skipped:
                hook._after()
            return logs

        setattr(train_function, _HOOK, self)
        setattr(train_function, _ORIGINAL, original)
        self._wrapper = train_function
        self.model.train_function = train_function

    def detach(self):
        """Stops the hook and unwraps what can be unwrapped."""
        self._deactivate()
        _remove_detached(self.model)

    def _deactivate(self):
        self._wrapper = None


def mark_wrapper(wrapper, original):
    """Lets hooks see through a wrapper of the train function made elsewhere."""
    setattr(wrapper, _ORIGINAL, original)


def _chain(function):
    """`function` and the functions it wraps, as far as marked wrappers go."""
    while function is not None:
        yield function
        function = getattr(function, _ORIGINAL, None)


def _remove_detached(model):
    """Unwraps detached hooks from the top of the model's train function."""
    while True:
        top = model.train_function
        hook = getattr(top, _HOOK, None)
        if hook is None or hook._wrapper is top:
            return
        model.train_function = getattr(top, _ORIGINAL)


def abandon_other_fits(model, owner):
    """Stops the hooks on `model` attached by a fit other than `owner`.

    A fit of the model is starting, so such a hook belongs to a fit that
    ended by an exception (Keras then skips `on_train_end`); its
    `on_abandoned` is called.
    """
    if owner is None:
        return
    for function in list(_chain(model.train_function)):
        hook = getattr(function, _HOOK, None)
        if hook is None or hook._wrapper is not function or hook.owner is owner:
            continue
        hook._deactivate()
        if hook._on_abandoned is not None:
            hook._on_abandoned()


def execution_callback(after_execution):
    """A Keras callback that calls `after_execution(model)` after each call of the train function.

    For callbacks whose only work of each step is that call: no batch hook,
    attached at the start of each `fit` and detached at its end.
    """
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
