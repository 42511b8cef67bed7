"""A model's training state: its variables and those of every optimizer it holds, saved and put back."""

from keras_scaling.fit_hooks._step_counter import held_optimizers


def training_variables(model):
    """The model's variables, then each held optimizer's, `model.optimizer` first (a GAN's `d_optimizer` and `g_optimizer` too)."""
    variables = list(model.variables)
    for optimizer in held_optimizers(model).values():
        if optimizer is not None:
            variables += optimizer.variables
    return variables


def saved(model):
    """`{id(variable): value}` of every training variable of `model`, to give `put_back`."""
    return {id(variable): variable.numpy() for variable in training_variables(model)}


def put_back(model, values, made_since=None):
    """Assigns `saved` `values` back; a variable made since (a slot a first step made) gets `made_since(variable)`, or is left."""
    for variable in training_variables(model):
        value = values.get(id(variable))
        if value is None and made_since is not None:
            value = made_since(variable)
        if value is not None:
            variable.assign(value)
