"""The distributed variables of a Keras model and optimizer, each with its role."""

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from keras_scaling.internals import _keras
from keras_scaling.replica_sync import _copy_comparison as roles

if TYPE_CHECKING:
    import keras


@dataclasses.dataclass(frozen=True)
class TrackedVariable:
    """One distributed variable to compare across replicas.

    Args:
        path: the Keras variable path, such as `"sequential/dense/kernel"`.
        variable: the distributed `tf.Variable`, one copy per replica.
        role: `TRAINABLE`, `NON_TRAINABLE`, `SEED_GENERATOR`, `OPTIMIZER_ITERATIONS`,
            `OPTIMIZER_VARIABLE` or `GRADIENT_ACCUMULATOR`.
        per_replica_reason: why its copies may legitimately differ, or None.

    Example:

    ```python
    kernel = TrackedVariable("dense/kernel", tf.Variable([1.0, 2.0]), "trainable")
    print(kernel.shape, kernel.aggregation, kernel.is_per_replica_state)   # (2,) NONE False
    ```
    """

    path: str
    variable: tf.Variable
    role: str
    per_replica_reason: str | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.variable.shape)

    @property
    def dtype(self) -> str:
        return self.variable.dtype.name

    @property
    def aggregation(self) -> str:
        return _enum_name(self.variable.aggregation)

    @property
    def synchronization(self) -> str:
        return _enum_name(self.variable.synchronization)

    @property
    def is_per_replica_state(self) -> bool:
        return self.per_replica_reason is not None


def _enum_name(value: object) -> str:
    return getattr(value, "name", str(value))


def distributed_variable(variable: Any) -> tf.Variable:
    """The `tf.Variable` under a Keras variable (or the variable itself).

    Args:
        variable: a `keras.Variable` or a `tf.Variable`.

    Returns:
        The `tf.Variable`.

    Raises:
        TypeError: `variable` is neither.

    Example:

    ```python
    weight = distributed_variable(keras.Variable(1.0))
    isinstance(weight, tf.Variable)   # True
    ```
    """
    if isinstance(variable, tf.Variable):
        return variable
    if _keras.is_keras_variable(variable):
        return _keras.tf_variable_of(variable)
    raise TypeError(
        f"variable must be a Keras or TensorFlow variable, got {type(variable).__name__}"
    )


def is_distributed(tf_variable: tf.Variable) -> bool:
    """Whether a `tf.Variable` holds one copy per replica (was created in a strategy's scope).

    Args:
        tf_variable: a `tf.Variable`, such as `distributed_variable(v)`.

    Returns:
        bool.

    Example:

    ```python
    is_distributed(tf.Variable(1.0))   # False: created outside any scope
    ```
    """
    return isinstance(tf_variable, tf.distribute.DistributedValues)


def inner_optimizers(optimizer: "keras.optimizers.Optimizer") -> list[Any]:
    """The optimizer and those it wraps (a `LossScaleOptimizer`'s), outermost first."""
    optimizers = [optimizer]
    while getattr(optimizers[-1], "inner_optimizer", None) is not None:
        optimizers.append(optimizers[-1].inner_optimizer)
    return optimizers


def _optimizer_list(optimizer: Any) -> list[Any]:
    if optimizer is None:
        return []
    return list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]


def tracked_variables(
    model: "keras.Model",
    optimizer: "keras.optimizers.Optimizer | Sequence[keras.optimizers.Optimizer] | None" = None,
) -> list[TrackedVariable]:
    """Lists the distributed variables of a model and, optionally, its optimizers, once each.

    Single-copy variables (created outside the scope) are left out. Per-replica state:
    `ON_READ`, the statistics of `BatchNormalization(synchronized=False)`, gradient accumulators.

    Args:
        model: a built `keras.Model`.
        optimizer: a built Keras optimizer, a list of them (a GAN's `d_optimizer` and
            `g_optimizer`), or None to leave optimizer variables out.

    Returns:
        A list of `TrackedVariable`, model variables first.

    Example:

    ```python
    keras_scaling.use_logical_cpus(2)
    with keras_scaling.auto_strategy().scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization()])
    [v.role for v in tracked_variables(model)]   # ['trainable', 'trainable', 'non-trainable', 'non-trainable']
    ```
    """
    import keras

    batch_norm = {  # the moving statistics of BatchNormalization(synchronized=False)
        id(statistic): layer.name
        for layer in _keras.all_layers(model)
        if isinstance(layer, keras.layers.BatchNormalization) and not layer.synchronized
        for statistic in (layer.moving_mean, layer.moving_variance)
    }
    seed_states = _keras.seed_generator_state_ids(model)
    found, seen = [], set()

    def add(keras_variable: Any, role: str, reason: str | None = None) -> None:
        tf_variable = distributed_variable(keras_variable)
        if id(tf_variable) in seen or not is_distributed(tf_variable):
            return
        seen.add(id(tf_variable))
        if reason is None and tf_variable.synchronization == tf.VariableSynchronization.ON_READ:
            reason = "synchronization ON_READ: each replica keeps its own value"
        path = getattr(keras_variable, "path", None) or tf_variable.name
        found.append(TrackedVariable(path, tf_variable, role, reason))

    for variable in model.variables:
        if id(variable) in batch_norm:
            layer = batch_norm[id(variable)]
            reason = f"BatchNormalization {layer!r} moving statistics are updated from each replica's own batch (synchronized=False)"
            add(variable, roles.NON_TRAINABLE, reason)
        elif id(variable) in seed_states:
            add(variable, roles.SEED_GENERATOR)
        else:
            add(variable, roles.TRAINABLE if variable.trainable else roles.NON_TRAINABLE)
    for outer in _optimizer_list(optimizer):
        optimizers = inner_optimizers(outer)
        counters = {id(o.iterations) for o in optimizers}
        accumulators = _keras.gradient_accumulator_ids(optimizers)
        for variable in outer.variables:
            if id(variable) in counters:
                add(variable, roles.OPTIMIZER_ITERATIONS)
            elif id(variable) in accumulators:
                reason = "gradient accumulator: holds each replica's own gradients between optimizer steps"
                add(variable, roles.GRADIENT_ACCUMULATOR, reason)
            else:
                add(variable, roles.OPTIMIZER_VARIABLE)
    return found


def single_copy_paths(model: "keras.Model", optimizer: Any = None) -> list[str]:
    """The paths of the variables with one copy only (created outside the scope)."""
    candidates = list(model.variables)
    for outer in _optimizer_list(optimizer):
        candidates += outer.variables
    return [v.path for v in candidates if not is_distributed(distributed_variable(v))]
