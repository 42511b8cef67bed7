"""Whether the copies of every weight on every replica are equal, and what differs.

The measuring core of `keras_scaling.callbacks.ReplicaSyncCheck`, usable on
its own:

- `tracked_variables(model, optimizer)` lists the distributed variables of a
  model and its optimizer, with their role and, for per-replica state (values
  that legitimately differ between replicas), the reason.
- `compare_copies(copies, atol, rtol)` compares the copies of one variable
  (NumPy arrays, replica 0 first) and measures how they differ.
- `likely_cause(variable, difference)` says what usually produces such a
  difference.
- `ReplicaStateChecker` fingerprints every replica's copies on the devices in
  one compiled function, gathers the small fingerprint table across replicas
  (and workers), fetches the copies of only the variables whose fingerprints
  differ, and returns a `ReplicaSyncReport`. It can also copy replica 0's
  values to every replica (`resync`) and average per-replica state.
"""

import dataclasses
import re

import numpy as np
import tensorflow as tf

from keras_scaling import _fingerprint
from keras_scaling import _keras_internals
from keras_scaling import devices

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

# Tiers of a `VariableReport`.
DIVERGENCE = "divergence"
FLOAT_DRIFT = "float drift"
PER_REPLICA_STATE = "per-replica state"

# The values of `ReplicaStateChecker(per_replica_state=...)`.
PER_REPLICA_STATE_MODES = ("warn", "ignore", "error", "average")

# Roles of tracked variables.
TRAINABLE = "trainable"
NON_TRAINABLE = "non-trainable"
SEED_GENERATOR = "seed generator state"
OPTIMIZER_ITERATIONS = "optimizer iteration counter"
OPTIMIZER_VARIABLE = "optimizer variable"
GRADIENT_ACCUMULATOR = "gradient accumulator"


@dataclasses.dataclass(frozen=True)
class TrackedVariable:
    """One distributed variable to compare across replicas.

    Args:
        path: the Keras variable path, such as `"sequential/dense/kernel"`.
        variable: the distributed `tf.Variable` (for example a
            `MirroredVariable`) that holds one copy per replica.
        role: what the variable is: trainable, non-trainable, seed generator
            state, optimizer iteration counter, optimizer variable or
            gradient accumulator.
        per_replica_reason: why its copies may legitimately differ between
            replicas, or None when they must be equal.

    Example:

    ```python
    kernel = tracked_variables(model)[0]
    kernel.path, kernel.aggregation, kernel.is_per_replica_state
    # ("sequential/dense/kernel", "NONE", False)
    ```
    """

    path: str
    variable: tf.Variable
    role: str
    per_replica_reason: str = None

    @property
    def shape(self):
        return tuple(self.variable.shape)

    @property
    def dtype(self):
        return self.variable.dtype.name

    @property
    def aggregation(self):
        return _enum_name(self.variable.aggregation)

    @property
    def synchronization(self):
        return _enum_name(self.variable.synchronization)

    @property
    def is_per_replica_state(self):
        return self.per_replica_reason is not None


def _enum_name(value):
    return getattr(value, "name", str(value))


def distributed_variable(variable):
    """The `tf.Variable` under a Keras variable (or the variable itself).

    Keras 3 variables wrap a `tf.Variable` in `_value`; under a strategy's
    scope that is a distributed variable with one component per replica.

    Args:
        variable: a `keras.Variable` or a `tf.Variable`.

    Example:

    ```python
    tf_kernel = distributed_variable(model.layers[0].kernel)
    strategy.experimental_local_results(tf_kernel)   # one copy per replica
    ```
    """
    if isinstance(variable, tf.Variable):
        return variable
    if _keras_internals.is_keras_variable(variable):
        return _keras_internals.tf_variable_of(variable)
    raise TypeError(
        f"variable must be a Keras or TensorFlow variable, got "
        f"{type(variable).__name__}"
    )


def is_distributed(tf_variable):
    """Whether a `tf.Variable` holds one copy per replica.

    A variable created under a strategy's scope is a
    `tf.distribute.DistributedValues` (for example a `MirroredVariable`); one
    created outside it has a single copy and is not.

    Args:
        tf_variable: a `tf.Variable`, such as `distributed_variable(v)` for a
            Keras variable `v`.

    Returns:
        bool.

    Example:

    ```python
    is_distributed(distributed_variable(model.layers[0].kernel))  # True in scope
    ```
    """
    return isinstance(tf_variable, tf.distribute.DistributedValues)


def _unsynchronized_batch_norm_statistics(model):
    import keras

    found = {}
    for layer in _keras_internals.all_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization) and not getattr(
            layer, "synchronized", False
        ):
            for variable in (layer.moving_mean, layer.moving_variance):
                if variable is not None:
                    found[id(variable)] = layer.name
    return found


def tracked_variables(model, optimizer=None):
    """Lists the distributed variables of a model and, optionally, its optimizer.

    Variables with a single copy (created outside the strategy's scope) are
    left out: there is nothing to compare. Each variable is listed once.

    Per-replica state is recognised explicitly: variables with
    `synchronization=ON_READ`, the `moving_mean` and `moving_variance` of
    `keras.layers.BatchNormalization(synchronized=False)` (updated from each
    replica's own batch), and the optimizer's gradient accumulators.

    Args:
        model: a built `keras.Model`.
        optimizer: a built Keras optimizer, or None to leave optimizer
            variables out.

    Returns:
        A list of `TrackedVariable`, model variables first.

    Example:

    ```python
    for variable in tracked_variables(model, model.optimizer):
        print(variable.path, variable.role, variable.per_replica_reason)
    ```
    """
    batch_norm = _unsynchronized_batch_norm_statistics(model)
    seed_states = _keras_internals.seed_generator_state_ids(model)
    found, seen = [], set()

    def add(keras_variable, role, reason=None):
        tf_variable = distributed_variable(keras_variable)
        if id(tf_variable) in seen or not is_distributed(tf_variable):
            return
        seen.add(id(tf_variable))
        if reason is None and tf_variable.synchronization == tf.VariableSynchronization.ON_READ:
            reason = (
                "synchronization ON_READ: each replica keeps its own value and "
                "reads combine them"
            )
        path = getattr(keras_variable, "path", None) or tf_variable.name
        found.append(TrackedVariable(path, tf_variable, role, reason))

    for variable in model.variables:
        if id(variable) in batch_norm:
            reason = (
                f"BatchNormalization {batch_norm[id(variable)]!r} moving "
                "statistics are updated from each replica's own batch "
                "(synchronized=False)"
            )
            add(variable, NON_TRAINABLE, reason)
        elif id(variable) in seed_states:
            add(variable, SEED_GENERATOR)
        else:
            add(variable, TRAINABLE if variable.trainable else NON_TRAINABLE)
    if optimizer is not None:
        # A LossScaleOptimizer wraps the optimizer that counts the steps.
        optimizers = [optimizer]
        while getattr(optimizers[-1], "inner_optimizer", None) is not None:
            optimizers.append(optimizers[-1].inner_optimizer)
        counters = {id(o.iterations) for o in optimizers}
        accumulators = _keras_internals.gradient_accumulator_ids(optimizers)
        for variable in optimizer.variables:
            if id(variable) in counters:
                add(variable, OPTIMIZER_ITERATIONS)
            elif id(variable) in accumulators:
                add(
                    variable,
                    GRADIENT_ACCUMULATOR,
                    "gradient accumulator: holds each replica's own gradients "
                    "between optimizer steps",
                )
            else:
                add(variable, OPTIMIZER_VARIABLE)
    return found


@dataclasses.dataclass(frozen=True)
class CopyDifference:
    """How the copies of one variable differ from replica 0's copy.

    Args:
        differing_replicas: indices of the replicas whose copy is not
            bitwise equal to replica 0's.
        num_differing_elements: elements that differ on at least one replica.
        num_elements: elements in the variable.
        max_abs_diff: the largest `|copy - copy_0|` over all replicas (inf
            when a value is NaN on one replica only).
        max_rel_diff: the largest `|copy - copy_0| / |copy_0|`.
        nan_counts: NaN elements in each replica's copy.
        inf_counts: Inf elements in each replica's copy.
        within_tolerance: whether every difference is within
            `atol + rtol * |copy_0|` (never true when the tolerances are 0).

    Example:

    ```python
    difference = compare_copies([np.float32([1, 2]), np.float32([1, 5])])
    difference.differing_replicas, difference.max_abs_diff   # ((1,), 3.0)
    ```
    """

    differing_replicas: tuple
    num_differing_elements: int
    num_elements: int
    max_abs_diff: float
    max_rel_diff: float
    nan_counts: tuple
    inf_counts: tuple
    within_tolerance: bool


def _bits(array):
    array = np.asarray(array)
    if array.dtype == np.bool_:
        return array.view(np.uint8)
    return array.view(f"u{array.dtype.itemsize}") if array.dtype.itemsize <= 8 else array


def _non_finite_counts(array):
    if not (np.issubdtype(array.dtype, np.inexact) or array.dtype.name == "bfloat16"):
        return 0, 0
    values = array.astype(np.complex128 if np.iscomplexobj(array) else np.float64)
    return int(np.isnan(values).sum()), int(np.isinf(values).sum())


def compare_copies(copies, atol=0.0, rtol=0.0):
    """Compares every replica's copy of a variable with replica 0's copy.

    Equality is bitwise: `-0.0` and `0.0`, or two NaNs with different
    payloads, are different copies.

    Args:
        copies: a sequence of NumPy arrays of one shape and dtype, one per
            replica, replica 0 first.
        atol: float, absolute tolerance of the "float drift" tier, default 0.
        rtol: float, relative tolerance of the "float drift" tier, default 0.

    Returns:
        A `CopyDifference`.

    Example:

    ```python
    a = np.float32([1.0, 2.0])
    compare_copies([a, np.nextafter(a, 3, dtype=np.float32)]).max_abs_diff
    # 2.384e-07
    ```
    """
    copies = [np.asarray(copy) for copy in copies]
    reference = copies[0]
    ref_bits = _bits(reference)
    ref_values = reference.astype(
        np.complex128 if np.iscomplexobj(reference) else np.float64
    )
    differing, any_differs = [], np.zeros(reference.shape, dtype=bool)
    max_abs = max_rel = 0.0
    within = bool(atol > 0 or rtol > 0)
    for index, copy in enumerate(copies[1:], start=1):
        differs = _bits(copy) != ref_bits
        if not differs.any():
            continue
        differing.append(index)
        any_differs |= differs
        values = copy.astype(ref_values.dtype)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            abs_diff = np.abs(values[differs] - ref_values[differs])
            # A NaN against a number is as far apart as values can be.
            abs_diff = np.where(np.isnan(abs_diff), np.inf, abs_diff)
            both_nan = np.isnan(values[differs]) & np.isnan(ref_values[differs])
            abs_diff = np.where(both_nan, 0.0, abs_diff)
            scale = np.abs(ref_values[differs])
            rel_diff = np.where(scale > 0, abs_diff / np.where(scale > 0, scale, 1), np.inf)
            rel_diff = np.where(abs_diff == 0, 0.0, rel_diff)
        max_abs = max(max_abs, float(abs_diff.max()))
        max_rel = max(max_rel, float(rel_diff.max()))
        within = within and bool(np.all(abs_diff <= atol + rtol * scale))
    nan_inf = [_non_finite_counts(copy) for copy in copies]
    return CopyDifference(
        differing_replicas=tuple(differing),
        num_differing_elements=int(any_differs.sum()),
        num_elements=int(reference.size),
        max_abs_diff=max_abs,
        max_rel_diff=max_rel,
        nan_counts=tuple(count[0] for count in nan_inf),
        inf_counts=tuple(count[1] for count in nan_inf),
        within_tolerance=within and bool(differing),
    )


def likely_cause(variable, difference):
    """What usually makes a variable's copies differ like this, in one sentence.

    NaN or Inf on some replicas only comes first; then per-replica state,
    differences within tolerance, and the variable's role and aggregation.

    Args:
        variable: the `TrackedVariable`.
        difference: its `CopyDifference`.

    Example:

    ```python
    likely_cause(variable, compare_copies(copies))
    # "gradients were not combined across replicas before the update ..."
    ```
    """
    non_finite = [
        nan + inf for nan, inf in zip(difference.nan_counts, difference.inf_counts)
    ]
    if any(non_finite) and not all(non_finite):
        replicas = ", ".join(str(i) for i, count in enumerate(non_finite) if count)
        return (
            f"NaN/Inf on replica(s) {replicas} only: non-finite gradients or "
            "activations from that replica's batch (check the inputs and the "
            "loss on that shard, or lower the learning rate)"
        )
    if variable.is_per_replica_state:
        return variable.per_replica_reason
    if difference.within_tolerance:
        return (
            "float drift: tiny differences, as from a non-deterministic "
            "reduction order on some replicas"
        )
    if variable.role == OPTIMIZER_ITERATIONS:
        return (
            "optimizer steps were applied on some replicas only (a custom "
            "train_step or optimizer call that skips or repeats apply on "
            "some replicas)"
        )
    if variable.role == TRAINABLE:
        return (
            "gradients were not combined across replicas before the update "
            "(keras-team/keras#19891), or a custom train_step applies "
            "per-replica gradients or assigns the weight in replica context"
        )
    if variable.role == OPTIMIZER_VARIABLE:
        return (
            "optimizer state was updated with per-replica gradients (gradients "
            "not combined across replicas, or a custom train_step)"
        )
    if variable.role == SEED_GENERATOR:
        return (
            "the seed generator advanced a different number of times on some "
            "replicas (random ops inside replica-dependent control flow)"
        )
    if variable.aggregation == "NONE":
        return (
            "non-trainable weight with aggregation 'none' assigned in replica "
            "context: each replica updates only its own copy "
            "(tensorflow/tensorflow#37834); give it aggregation='mean' "
            "(or 'only_first_replica'), or assign it outside the replica step"
        )
    return (
        f"non-trainable weight with aggregation {variable.aggregation.lower()!r} "
        "assigned from replica-local values or on some replicas only"
    )


@dataclasses.dataclass(frozen=True)
class VariableReport:
    """One variable whose copies differ between replicas.

    Args:
        path, shape, dtype, aggregation, synchronization, role: the
            variable (see `TrackedVariable`).
        tier: `"divergence"`, `"float drift"` (differences within
            `atol`/`rtol`) or `"per-replica state"`.
        difference: the `CopyDifference`.
        devices: the device of each differing replica.
        likely_cause: one sentence on what usually causes this.
        repair: what was done about it (`"averaged across replicas"`,
            `"resynced from replica 0"`), or None.

    Its `str` is a few readable lines.

    Example:

    ```python
    for variable in report.divergences:
        print(variable.path, variable.difference.max_abs_diff, variable.likely_cause)
    ```
    """

    path: str
    shape: tuple
    dtype: str
    aggregation: str
    synchronization: str
    role: str
    tier: str
    difference: CopyDifference
    devices: tuple
    likely_cause: str
    repair: str = None

    def __str__(self):
        diff = self.difference
        replicas = ", ".join(
            f"{replica} ({device})"
            for replica, device in zip(diff.differing_replicas, self.devices)
        )
        lines = [
            f"{self.tier.upper()}: {self.path} shape={self.shape} "
            f"dtype={self.dtype} aggregation={self.aggregation} "
            f"synchronization={self.synchronization} ({self.role})",
            f"  replicas differing from replica 0: {replicas}",
            f"  max abs diff {diff.max_abs_diff:.6g}, max rel diff "
            f"{diff.max_rel_diff:.6g}, {diff.num_differing_elements} of "
            f"{diff.num_elements} elements differ",
        ]
        if any(diff.nan_counts) or any(diff.inf_counts):
            counts = ", ".join(
                f"replica {i}: {nan} NaN/{inf} Inf"
                for i, (nan, inf) in enumerate(zip(diff.nan_counts, diff.inf_counts))
            )
            lines.append(f"  non-finite values: {counts}")
        lines.append(f"  likely cause: {self.likely_cause}")
        if self.repair:
            lines.append(f"  repair: {self.repair}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class ReplicaSyncReport:
    """The result of one comparison of every replica's copies.

    Args:
        step: the optimizer step at which the copies were compared.
        num_replicas: replicas compared (across all workers).
        num_workers: workers the replicas span.
        num_variables: variables compared.
        variables: a `VariableReport` for every variable whose copies
            differ, in every tier.

    Its `str` is a readable multi-line summary. `ok` is true when no
    variable diverged.

    Example:

    ```python
    report = keras_scaling.ReplicaSyncCheck().check()   # after fit
    if not report.ok:
        print(report)
    ```
    """

    step: int
    num_replicas: int
    num_workers: int
    num_variables: int
    variables: tuple = ()

    def _tier(self, tier):
        return tuple(v for v in self.variables if v.tier == tier)

    @property
    def divergences(self):
        """The `VariableReport`s of the "divergence" tier."""
        return self._tier(DIVERGENCE)

    @property
    def float_drift(self):
        """The `VariableReport`s within `atol`/`rtol`."""
        return self._tier(FLOAT_DRIFT)

    @property
    def per_replica_state(self):
        """The `VariableReport`s of per-replica state."""
        return self._tier(PER_REPLICA_STATE)

    @property
    def ok(self):
        """True when no variable diverged."""
        return not self.divergences

    @property
    def max_abs_diff(self):
        """The largest absolute difference among diverged and drifting variables."""
        values = [
            v.difference.max_abs_diff for v in self.divergences + self.float_drift
        ]
        return max(values, default=0.0)

    def __str__(self):
        workers = "worker" if self.num_workers == 1 else "workers"
        head = (
            f"Replica sync check at step {self.step}: {self.num_variables} "
            f"variables on {self.num_replicas} replicas ({self.num_workers} "
            f"{workers}): {len(self.divergences)} diverged, "
            f"{len(self.float_drift)} with float drift, "
            f"{len(self.per_replica_state)} per-replica state differ"
        )
        lines = [head]
        lines += [str(v) for v in self.divergences + self.float_drift + self.per_replica_state]
        return "\n".join(lines)


def _replica_devices(strategy):
    """A device name for every replica, in the order of `all_gather`."""
    local = list(devices.describe_strategy(strategy).local_devices)
    count, this_worker = devices.num_workers(strategy), devices.worker_index(strategy)
    names = []
    for worker in range(count):
        for name in local:
            if worker == this_worker:
                names.append(name)
            elif "/task:" in name:
                names.append(re.sub(r"/task:\d+", f"/task:{worker}", name))
            else:
                names.append(f"worker {worker}")
    return names


class ReplicaStateChecker:
    """Compares every replica's copy of a list of distributed variables.

    `check()` runs one compiled function in which every replica fingerprints
    its own copy of every variable (see `keras_scaling._fingerprint`). On one
    worker the replicas' rows are read locally; across workers they are
    gathered with the replica context's `all_gather`, so every worker gets
    the same table and reaches the same verdict. Only the variables whose
    fingerprints differ are gathered in full to measure the differences. Under several workers, `check()`, `resync()` and
    per-replica-state averaging are collective: every worker must call them
    at the same point, as a callback triggered by the optimizer step does.

    Args:
        strategy: the `tf.distribute.Strategy` the variables belong to.
        variables: a list of `TrackedVariable`.
        atol: float, absolute tolerance of the "float drift" tier, default 0.
        rtol: float, relative tolerance of the "float drift" tier, default 0.
        per_replica_state: `"warn"`, `"ignore"`, `"error"` or `"average"`:
            how per-replica state is reported ("error": as divergence;
            "ignore": not compared at all; "average": the copies are replaced
            by their mean across replicas after the comparison).

    Example:

    ```python
    checker = ReplicaStateChecker(
        strategy, tracked_variables(model, model.optimizer))
    report = checker.check(step=0)
    print(report)
    ```
    """

    def __init__(self, strategy, variables, atol=0.0, rtol=0.0, per_replica_state="warn"):
        if per_replica_state not in PER_REPLICA_STATE_MODES:
            raise ValueError(
                f"per_replica_state must be one of {PER_REPLICA_STATE_MODES}, "
                f"got {per_replica_state!r}"
            )
        self.strategy = strategy
        self.atol, self.rtol = float(atol), float(rtol)
        self.per_replica_state = per_replica_state
        if per_replica_state == "ignore":
            variables = [v for v in variables if not v.is_per_replica_state]
        self.variables = list(variables)
        self.num_replicas = strategy.num_replicas_in_sync
        self.num_workers = devices.num_workers(strategy)
        self.replica_devices = _replica_devices(strategy)
        self._fingerprint_function = None
        self._gather_functions = {}

    def _build_fingerprint_function(self):
        tf_variables = [v.variable for v in self.variables]
        strategy, across_workers = self.strategy, self.num_workers > 1

        def replica_fn():
            # In replica context, reading a distributed variable reads this
            # replica's own copy.
            table = _fingerprint.fingerprint_table(
                [tf.identity(variable) for variable in tf_variables]
            )
            if not across_workers:
                return table
            context = tf.distribute.get_replica_context()
            return context.all_gather(table[tf.newaxis], axis=0)

        @tf.function(autograph=False)
        def fingerprint_all():
            return strategy.run(replica_fn)

        return fingerprint_all

    def fingerprints(self):
        """The int64 table `[num_replicas, num_variables]` of fingerprints."""
        if not self.variables:
            return np.zeros([self.num_replicas, 0], np.int64)
        if self._fingerprint_function is None:
            self._fingerprint_function = self._build_fingerprint_function()
        local = self.strategy.experimental_local_results(self._fingerprint_function())
        if self.num_workers > 1:
            return local[0].numpy()
        # On one worker every replica's row is local: no collective needed.
        # (Collectives of two MirroredStrategy objects in one process share
        # instance keys and can clash.)
        return np.stack([row.numpy() for row in local])

    def gather(self, indices):
        """Every replica's copy of `self.variables[i]` for `i` in `indices`.

        Returns a list (one entry per index) of lists of NumPy arrays (one
        per replica, across all workers, replica 0 first).
        """
        indices = tuple(indices)
        if not indices:
            return []
        if self.num_workers == 1:
            return [
                [
                    np.asarray(copy.numpy())
                    for copy in self.strategy.experimental_local_results(
                        self.variables[i].variable
                    )
                ]
                for i in indices
            ]
        if indices not in self._gather_functions:
            tf_variables = [self.variables[i].variable for i in indices]
            strategy = self.strategy

            def replica_fn():
                context = tf.distribute.get_replica_context()
                return [
                    context.all_gather(tf.identity(variable)[tf.newaxis], axis=0)
                    for variable in tf_variables
                ]

            @tf.function(autograph=False)
            def gather_all():
                return strategy.run(replica_fn)

            self._gather_functions[indices] = gather_all
        gathered = self._gather_functions[indices]()
        local = [
            self.strategy.experimental_local_results(values)[0].numpy()
            for values in gathered
        ]
        return [list(values) for values in local]

    def _tier(self, variable, difference):
        if variable.is_per_replica_state and self.per_replica_state != "error":
            return PER_REPLICA_STATE
        if difference.within_tolerance:
            return FLOAT_DRIFT
        return DIVERGENCE

    def check(self, step):
        """Compares the copies now and returns a `ReplicaSyncReport`.

        With `per_replica_state="average"`, per-replica state that differs is
        replaced by its mean across replicas, and its report says so.

        Args:
            step: int, the optimizer step to put in the report.
        """
        table = self.fingerprints()
        suspects = [int(i) for i in np.flatnonzero(np.any(table != table[:1], axis=0))]
        copies_by_index = dict(zip(suspects, self.gather(suspects)))
        reports = []
        for index in suspects:
            variable, copies = self.variables[index], copies_by_index[index]
            difference = compare_copies(copies, self.atol, self.rtol)
            if not difference.differing_replicas:
                # Fingerprints are deterministic (an integer sum): the copies
                # were assigned between the fingerprints and the gather.
                continue
            tier = self._tier(variable, difference)
            repair = None
            if tier == PER_REPLICA_STATE and self.per_replica_state == "average":
                self._assign_everywhere(variable, _mean_copy(copies))
                repair = "averaged across replicas"
            reports.append(
                VariableReport(
                    path=variable.path,
                    shape=variable.shape,
                    dtype=variable.dtype,
                    aggregation=variable.aggregation,
                    synchronization=variable.synchronization,
                    role=variable.role,
                    tier=tier,
                    difference=difference,
                    devices=tuple(
                        self.replica_devices[r] for r in difference.differing_replicas
                    ),
                    likely_cause=likely_cause(variable, difference),
                    repair=repair,
                )
            )
        return ReplicaSyncReport(
            step=int(step),
            num_replicas=self.num_replicas,
            num_workers=self.num_workers,
            num_variables=len(self.variables),
            variables=tuple(reports),
        )

    def resync(self, report):
        """Copies replica 0's value to every replica for the diverged variables.

        Returns a new report whose diverged variables say they were resynced.
        """
        by_path = {v.path: i for i, v in enumerate(self.variables)}
        indices = [by_path[v.path] for v in report.divergences]
        for index, copies in zip(indices, self.gather(indices)):
            self._assign_everywhere(self.variables[index], copies[0])
        repaired = tuple(
            dataclasses.replace(v, repair="resynced from replica 0")
            if v.tier == DIVERGENCE
            else v
            for v in report.variables
        )
        return dataclasses.replace(report, variables=repaired)

    def _assign_everywhere(self, variable, value):
        for component in self.strategy.experimental_local_results(variable.variable):
            component.assign(value)


def _mean_copy(copies):
    reference = copies[0]
    mean = np.mean(np.stack(copies).astype(np.float64), axis=0)
    if np.issubdtype(reference.dtype, np.integer):
        mean = np.rint(mean)
    return mean.astype(reference.dtype)

