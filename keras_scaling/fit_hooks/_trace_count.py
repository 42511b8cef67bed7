"""How often a model's train step was traced, without reading Keras' internals.

Keras gives a callback no handle on tracing, but a model's public
`train_step` runs in Python only while Keras traces its train function, and
callbacks get the model (`set_model`) before `fit` makes that function.
The counting `train_step` is an attribute of the model object, set for one
`fit` and removed when it ends (`count_traces` returns how).
"""

import weakref

_trace_counts: weakref.WeakKeyDictionary[type, int] = weakref.WeakKeyDictionary()


def count_traces(model):
    """Makes `model.train_step` count its calls; returns the undo, or None.

    None when it already counts or the model has a `train_step` of its own
    object (left alone). The undo puts the class's `train_step` back.
    """
    own = vars(model).get("train_step")
    if own is not None:
        return None
    _trace_counts.setdefault(model, 0)
    train_step = model.train_step
    model_ref = weakref.ref(model)

    def counting_train_step(data):
        owner = model_ref()
        if owner is not None:
            _trace_counts[owner] = _trace_counts.get(owner, 0) + 1
        return train_step(data)

    model.train_step = counting_train_step

    def undo():
        owner = model_ref()
        if owner is not None and vars(owner).get("train_step") is counting_train_step:
            del owner.train_step

    return undo


def traces(model):
    """How often `model`'s train step was traced, 0 when eager or not counted."""
    if model.run_eagerly:
        return 0  # nothing is traced: train_step runs at every step
    return _trace_counts.get(model, 0)
