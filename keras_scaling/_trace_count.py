"""How often a model's train step was traced, without reading Keras' internals.

Keras gives a callback no handle on tracing, but a model's public
`train_step` runs in Python only while Keras traces its train function, and
callbacks get the model (`set_model`) before `fit` makes that function.
"""

import weakref

_trace_counts = weakref.WeakKeyDictionary()


def count_traces(model):
    """Makes `model.train_step` count its calls, once per model."""
    if model in _trace_counts or "train_step" in vars(model):
        return
    _trace_counts[model] = 0
    train_step = model.train_step
    model_ref = weakref.ref(model)

    def counting_train_step(data):
        owner = model_ref()
        if owner is not None:
            _trace_counts[owner] = _trace_counts.get(owner, 0) + 1
        return train_step(data)

    model.train_step = counting_train_step


def traces(model):
    """How often `model`'s train step was traced, 0 when eager or not counted."""
    if model.run_eagerly:
        return 0  # nothing is traced: train_step runs at every step
    return _trace_counts.get(model, 0)
