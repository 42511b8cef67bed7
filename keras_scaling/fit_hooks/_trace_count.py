"""How often a model's train step was traced: its public `train_step` runs in Python only then."""

import weakref

_trace_counts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def count_traces(model):
    """Makes `model.train_step` count its calls; returns the undo, or None when the object has its own `train_step`."""
    if vars(model).get("train_step") is not None:
        return None
    _trace_counts.setdefault(model, 0)
    train_step, model_ref = model.train_step, weakref.ref(model)

    def counting_train_step(data):
        if (owner := model_ref()) is not None:
            _trace_counts[owner] = _trace_counts.get(owner, 0) + 1
        return train_step(data)

    model.train_step = counting_train_step

    def undo():
        owner = model_ref()
        if owner is not None and vars(owner).get("train_step") is counting_train_step:
            del owner.train_step

    return undo


def traces(model):
    """How often `model`'s train step was traced; 0 when eager (nothing is traced) or not counted."""
    return 0 if model.run_eagerly else _trace_counts.get(model, 0)
