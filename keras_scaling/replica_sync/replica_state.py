"""Whether the copies of every weight on every replica are equal, and what differs: the core of
`keras_scaling.callbacks.ReplicaSyncCheck`, usable on its own."""

from keras_scaling.replica_sync._copy_comparison import (
    DIVERGENCE,
    FLOAT_DRIFT,
    GRADIENT_ACCUMULATOR,
    NON_TRAINABLE,
    OPTIMIZER_ITERATIONS,
    OPTIMIZER_VARIABLE,
    PER_REPLICA_STATE,
    PER_REPLICA_STATE_MODES,
    SEED_GENERATOR,
    TRAINABLE,
    CopyDifference,
    ReplicaSyncReport,
    VariableReport,
    compare_copies,
    likely_cause,
)
from keras_scaling.replica_sync._replica_state_checker import ReplicaStateChecker
from keras_scaling.replica_sync._tracked_variables import (
    TrackedVariable,
    distributed_variable,
    is_distributed,
    tracked_variables,
)

__all__ = [
    "DIVERGENCE",
    "FLOAT_DRIFT",
    "GRADIENT_ACCUMULATOR",
    "NON_TRAINABLE",
    "OPTIMIZER_ITERATIONS",
    "OPTIMIZER_VARIABLE",
    "PER_REPLICA_STATE",
    "PER_REPLICA_STATE_MODES",
    "SEED_GENERATOR",
    "TRAINABLE",
    "CopyDifference",
    "ReplicaStateChecker",
    "ReplicaSyncReport",
    "TrackedVariable",
    "VariableReport",
    "compare_copies",
    "distributed_variable",
    "is_distributed",
    "likely_cause",
    "tracked_variables",
]
