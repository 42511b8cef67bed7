"""Whether the copies of every weight on every replica are equal, and what differs.

The measuring core of `keras_scaling.callbacks.ReplicaSyncCheck`, usable on
its own. It is three layers, each in a module of its own, and this module
gathers their public names:

- comparing copies, pure NumPy (`keras_scaling.replica_sync._copy_comparison`):
  `compare_copies(copies, atol, rtol)` measures how the copies of one
  variable (NumPy arrays, replica 0 first) differ, `likely_cause(variable,
  difference)` says what usually produces such a difference, and
  `VariableReport` and `ReplicaSyncReport` hold the verdict;
- finding the variables, Keras (`keras_scaling.replica_sync._tracked_variables`):
  `tracked_variables(model, optimizer)` lists the distributed variables of a
  model and its optimizer, with their role and, for per-replica state
  (values that legitimately differ between replicas), the reason;
- running on the replicas, TensorFlow
  (`keras_scaling.replica_sync._replica_state_checker`): `ReplicaStateChecker`
  fingerprints every replica's copies on the devices in one compiled
  function, gathers the small fingerprint table across replicas (and
  workers), fetches the copies of only the variables whose fingerprints
  differ, and returns a `ReplicaSyncReport`. It can also copy replica 0's
  values to every replica (`resync`) and average per-replica state.
"""

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
