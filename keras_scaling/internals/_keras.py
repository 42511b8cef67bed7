"""Private Keras names outside the trainer: layers, optimizers, variables.

Keras has no public way to list every nested layer, or to tell
seed-generator states and gradient accumulators from other variables. Each
such reach is here, guarded:
when a release moves the name, the guard logs one warning and the caller
gets a fallback built from public names, or "unknown".
"""

import keras
import tensorflow as tf

from keras_scaling.internals import _probes


def _public_layers(model):
    """Every layer reachable through the public `layers` lists, model included."""
    found, pending, seen = [], [model], set()
    while pending:
        layer = pending.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        found.append(layer)
        pending.extend(getattr(layer, "layers", None) or ())
    return found


@_probes.guarded(
    "keras.layer.flatten_layers",
    reaches="keras.Layer._flatten_layers",
    lost=(
        "layers nested inside custom layers are not seen: their "
        "BatchNormalization statistics are compared as if mirrored"
    ),
    workaround=(
        "Use BatchNormalization(synchronized=True), or ReplicaSyncCheck("
        "per_replica_state='ignore')."
    ),
    fallback=_public_layers,
)
def all_layers(model):
    """Every layer of `model`, nested ones included, the model itself first."""
    return list(model._flatten_layers(include_self=True, recursive=True))


def _seed_states_by_path(model):
    return {
        id(variable)
        for variable in model.variables
        if variable.path.split("/")[-1] == "seed_generator_state"
    }


@_probes.guarded(
    "keras.layer.seed_generators",
    reaches="keras.Layer._seed_generators",
    lost="seed-generator states are recognised by their variable name only",
    workaround="Nothing to do unless you name variables 'seed_generator_state'.",
    fallback=_seed_states_by_path,
)
def seed_generator_state_ids(model):
    """The ids of the state variables of the model's seed generators."""
    states = set()
    layers = all_layers(model)
    if layers and not hasattr(layers[0], "_seed_generators"):
        raise AttributeError("keras.Layer has no attribute '_seed_generators'")
    for layer in layers:
        for generator in layer._seed_generators:
            states.add(id(generator.state))
    return states


def _accumulators_by_path(optimizers):
    return {
        id(variable)
        for optimizer in optimizers
        for variable in optimizer.variables
        if variable.path.endswith("_gradient_accumulator")
    }


@_probes.guarded(
    "keras.optimizer.accumulated_gradients",
    reaches="keras.Optimizer._accumulated_gradients",
    lost="gradient accumulators are recognised by their variable name only",
    workaround="Nothing to do unless you rename optimizer variables.",
    fallback=_accumulators_by_path,
)
def gradient_accumulator_ids(optimizers):
    """The ids of the gradient accumulators of `optimizers` (and their inner ones)."""
    found: set[int] = set()
    for optimizer in optimizers:
        if getattr(optimizer, "gradient_accumulation_steps", None):
            found.update(id(v) for v in optimizer._accumulated_gradients or ())
    return found


def tf_variable_of(variable):
    """The `tf.Variable` that a Keras variable wraps (its public `value`).

    Read outside an autocast scope, as callbacks are, `value` is the variable
    itself, not a cast copy.
    """
    value = variable.value
    if not isinstance(value, tf.Variable):
        raise TypeError(
            f"variable must be a Keras or TensorFlow variable, got {type(variable).__name__}"
        )
    return value


def is_keras_variable(value):
    """Whether `value` is a Keras variable (not a raw `tf.Variable`)."""
    return isinstance(value, keras.Variable)


@_probes.guarded(
    "keras.optimizer.batch_counter",
    reaches="keras.Optimizer._iterations",
    lost=(
        "with gradient_accumulation_steps, the batches trained are not counted: "
        "ThroughputLogger measures nothing, BackupAndRestore refuses to start "
        "and ReplicaSyncCheck checks at the start of each fit only"
    ),
    workaround="Train without gradient_accumulation_steps for these figures.",
)
def accumulating_batch_counter(optimizer):
    """The variable in which an optimizer that accumulates gradients counts its batches.

    With `gradient_accumulation_steps=N`, Keras' public `iterations` is the
    number of weight updates (the batches divided by N) on recent releases,
    computed anew at each read; the batches are counted in `_iterations`.
    """
    counter = optimizer._iterations
    if not is_keras_variable(counter) and not isinstance(counter, tf.Variable):
        raise _probes.ReachError(f"_iterations is a {type(counter).__name__}, not a variable")
    return counter
