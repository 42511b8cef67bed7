"""Private Keras names outside the trainer (nested layers, seed states, accumulators), with fallbacks from public names."""

import keras
import tensorflow as tf

from keras_scaling.internals import _probes


def _public_layers(model):
    found, pending = {}, [model]
    while pending:
        layer = pending.pop()
        if id(layer) not in found:
            found[id(layer)] = layer
            pending.extend(getattr(layer, "layers", None) or ())
    return list(found.values())


@_probes.guarded(
    "keras.layer.flatten_layers",
    reaches="keras.Layer._flatten_layers",
    lost="layers nested inside custom layers are not seen: their BatchNormalization statistics are compared as if mirrored",
    workaround="Use BatchNormalization(synchronized=True), or ReplicaSyncCheck(per_replica_state='ignore').",
    fallback=_public_layers,
)
def all_layers(model):
    """Every layer of `model`, nested ones included, the model itself first."""
    return list(model._flatten_layers(include_self=True, recursive=True))


def _seed_states_by_path(model):
    return {id(v) for v in model.variables if v.path.split("/")[-1] == "seed_generator_state"}


@_probes.guarded(
    "keras.layer.seed_generators",
    reaches="keras.Layer._seed_generators",
    lost="seed-generator states are recognised by their variable name only",
    workaround="Nothing to do unless you name variables 'seed_generator_state'.",
    fallback=_seed_states_by_path,
)
def seed_generator_state_ids(model):
    """The ids of the state variables of the model's seed generators."""
    # Every layer has the list, so a missing one is an AttributeError here.
    return {id(gen.state) for layer in all_layers(model) for gen in layer._seed_generators}


def _accumulators_by_path(optimizers):
    variables = [v for optimizer in optimizers for v in optimizer.variables]
    return {id(v) for v in variables if v.path.endswith("_gradient_accumulator")}


@_probes.guarded(
    "keras.optimizer.accumulated_gradients",
    reaches="keras.Optimizer._accumulated_gradients",
    lost="gradient accumulators are recognised by their variable name only",
    workaround="Nothing to do unless you rename optimizer variables.",
    fallback=_accumulators_by_path,
)
def gradient_accumulator_ids(optimizers):
    """The ids of the gradient accumulators of `optimizers` (and their inner ones)."""
    accumulating = [o for o in optimizers if getattr(o, "gradient_accumulation_steps", None)]
    return {id(v) for o in accumulating for v in o._accumulated_gradients or ()}


def tf_variable_of(variable):
    """The `tf.Variable` a Keras variable wraps (its `value`, read outside autocast)."""
    value = variable.value
    if not isinstance(value, tf.Variable):
        raise TypeError(f"variable must be a Keras or TensorFlow variable, got {variable!r}")
    return value


def is_keras_variable(value):
    """Whether `value` is a Keras variable (not a raw `tf.Variable`)."""
    return isinstance(value, keras.Variable)


@_probes.guarded(
    "keras.optimizer.batch_counter",
    reaches="keras.Optimizer._iterations",
    lost="with gradient_accumulation_steps, the batches trained are not counted: ThroughputLogger measures nothing, BackupAndRestore refuses to start and ReplicaSyncCheck checks at the start of each fit only",
    workaround="Train without gradient_accumulation_steps for these figures.",
)
def accumulating_batch_counter(optimizer):
    """The batch counter of an optimizer with `gradient_accumulation_steps=N` (`iterations` counts updates)."""
    counter = optimizer._iterations
    if not is_keras_variable(counter) and not isinstance(counter, tf.Variable):
        raise _probes.ReachError(f"_iterations is a {type(counter).__name__}, not a variable")
    return counter
