"""A model's training state: its variables and those of every optimizer it holds, saved and put back."""

from keras_scaling.fit_hooks._step_counter import held_optimizers


def _optimizer_variables(model):
    return [
        v
        for optimizer in held_optimizers(model).values()
        if optimizer is not None
        for v in optimizer.variables
    ]


def training_variables(model):
    """The model's variables, then each held optimizer's, `model.optimizer` first (a GAN's `d_optimizer` and `g_optimizer` too)."""
    return list(model.variables) + _optimizer_variables(model)


def saved(model):
    """`{id(variable): value}` of every training variable of `model`, to give `put_back`."""
    return {id(variable): variable.numpy() for variable in training_variables(model)}


def put_back(model, values, new_slot=None):
    """Assigns `saved` `values` back; an optimizer variable made since (a slot a first step made) gets `new_slot(variable)`, if given."""
    new_slots = {id(v): v for v in _optimizer_variables(model)} if new_slot else {}
    for variable in training_variables(model):
        value = values.get(id(variable))
        if value is None and id(variable) in new_slots:
            value = new_slot(variable)
        if value is not None:
            variable.assign(value)
