"""How the copies of a variable differ between replicas, in plain NumPy.

The pure core of the replica check: it takes NumPy arrays (one copy per
replica, replica 0 first) and fingerprint tables, never a model or a
strategy, so it runs and is tested without Keras or TensorFlow. It measures
how copies differ (`compare_copies`), sorts each difference into a tier,
names its likely cause, and holds the reports (`VariableReport`,
`ReplicaSyncReport`). `keras_scaling.replica_state` re-exports its public
names.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

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
    import numpy as np
    from keras_scaling.replica_state import compare_copies

    difference = compare_copies([np.float32([1, 2]), np.float32([1, 5])])
    print(difference.differing_replicas, difference.max_abs_diff)   # (1,) 3.0
    ```
    """

    differing_replicas: tuple[int, ...]
    num_differing_elements: int
    num_elements: int
    max_abs_diff: float
    max_rel_diff: float
    nan_counts: tuple[int, ...]
    inf_counts: tuple[int, ...]
    within_tolerance: bool


def _bits(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype == np.bool_:
        return array.view(np.uint8)
    return array.view(f"u{array.dtype.itemsize}") if array.dtype.itemsize <= 8 else array


def _non_finite_counts(array: np.ndarray) -> tuple[int, int]:
    if not (np.issubdtype(array.dtype, np.inexact) or array.dtype.name == "bfloat16"):
        return 0, 0
    values = array.astype(np.complex128 if np.iscomplexobj(array) else np.float64)
    return int(np.isnan(values).sum()), int(np.isinf(values).sum())


def compare_copies(
    copies: Sequence[np.ndarray], atol: float = 0.0, rtol: float = 0.0
) -> CopyDifference:
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
    import numpy as np
    from keras_scaling.replica_state import compare_copies

    a = np.float32([1.0, 2.0])
    one_ulp_up = np.nextafter(a, np.float32(3))
    print(compare_copies([a, one_ulp_up]).max_abs_diff)   # 2.384185791015625e-07
    ```
    """
    copies = [np.asarray(copy) for copy in copies]
    reference = copies[0]
    ref_bits = _bits(reference)
    ref_values = reference.astype(np.complex128 if np.iscomplexobj(reference) else np.float64)
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


def differing_columns(fingerprint_table: np.ndarray) -> list[int]:
    """The variables whose fingerprints are not the same on every replica.

    Args:
        fingerprint_table: an integer array `[num_replicas, num_variables]`,
            row `r` holding replica `r`'s fingerprint of each variable.

    Returns:
        A list of column indices (ints), in increasing order.
    """
    table = np.asarray(fingerprint_table)
    return [int(i) for i in np.flatnonzero(np.any(table != table[:1], axis=0))]


def tier_of(
    is_per_replica_state: bool, per_replica_state_mode: str, difference: CopyDifference
) -> str:
    """The tier of a variable whose copies differ.

    Per-replica state is its own tier unless `per_replica_state_mode` is
    `"error"`; otherwise differences within tolerance are float drift and
    the rest divergence.

    Args:
        is_per_replica_state: bool, whether the copies may legitimately
            differ (see `TrackedVariable.per_replica_reason`).
        per_replica_state_mode: one of `PER_REPLICA_STATE_MODES`.
        difference: the variable's `CopyDifference`.

    Returns:
        `DIVERGENCE`, `FLOAT_DRIFT` or `PER_REPLICA_STATE`.
    """
    if is_per_replica_state and per_replica_state_mode != "error":
        return PER_REPLICA_STATE
    if difference.within_tolerance:
        return FLOAT_DRIFT
    return DIVERGENCE


def mean_copy(copies: Sequence[np.ndarray]) -> np.ndarray:
    """The element-wise mean of the copies, in replica 0's dtype.

    Integer copies are rounded to the nearest integer; the mean is taken in
    float64 so that float16 and bfloat16 copies do not overflow.

    Args:
        copies: a sequence of NumPy arrays of one shape and dtype.

    Returns:
        A NumPy array of replica 0's shape and dtype.
    """
    reference = np.asarray(copies[0])
    mean = np.mean(np.stack(copies).astype(np.float64), axis=0)
    if np.issubdtype(reference.dtype, np.integer):
        mean = np.rint(mean)
    return mean.astype(reference.dtype)


def likely_cause(variable: Any, difference: CopyDifference) -> str:
    """What usually makes a variable's copies differ like this, in one sentence.

    NaN or Inf on some replicas only comes first; then per-replica state,
    differences within tolerance, and the variable's role and aggregation.

    Args:
        variable: the `TrackedVariable`, or any object with its `role`,
            `aggregation` (an upper-case name such as `"NONE"`) and
            `per_replica_reason`.
        difference: its `CopyDifference`.

    Returns:
        str.

    Example:

    ```python
    import keras
    import keras_scaling
    from keras_scaling import replica_state

    keras_scaling.use_logical_cpus(2)
    strategy = keras_scaling.auto_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    kernel = replica_state.tracked_variables(model)[0]
    copies = [c.numpy() for c in strategy.experimental_local_results(kernel.variable)]
    copies[-1] = copies[-1] + 1.0   # as if the last replica had its own update
    difference = replica_state.compare_copies(copies)
    print(replica_state.likely_cause(kernel, difference))
    # gradients were not combined across replicas before the update ...
    ```
    """
    non_finite = [nan + inf for nan, inf in zip(difference.nan_counts, difference.inf_counts)]
    if any(non_finite) and not all(non_finite):
        replicas = ", ".join(str(i) for i, count in enumerate(non_finite) if count)
        return (
            f"NaN/Inf on replica(s) {replicas} only: non-finite gradients or "
            "activations from that replica's batch (check the inputs and the "
            "loss on that shard, or lower the learning rate)"
        )
    if variable.per_replica_reason is not None:
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
    import keras
    import keras_scaling

    keras_scaling.use_logical_cpus(2)
    strategy = keras_scaling.auto_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    check = keras_scaling.ReplicaSyncCheck()
    check.set_model(model)
    bias_copies = strategy.experimental_local_results(model.layers[0].bias.value)
    # As if the last replica had its own update:
    bias_copies[-1].assign([0.5])
    for variable in check.check().divergences:
        print(variable.path, variable.difference.max_abs_diff, variable.likely_cause)
    ```
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    aggregation: str
    synchronization: str
    role: str
    tier: str
    difference: CopyDifference
    devices: tuple[str, ...]
    likely_cause: str
    repair: str | None = None

    def __str__(self) -> str:
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
    import keras
    import numpy as np
    import keras_scaling

    keras_scaling.use_logical_cpus(2)
    strategy = keras_scaling.auto_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    check = keras_scaling.ReplicaSyncCheck(every_n_steps=4)
    model.fit(x, x[:, :1], batch_size=16, epochs=2, callbacks=[check], verbose=0)
    report = check.check()   # compare now
    print(report.ok, report.step)   # True 8
    if not report.ok:
        print(report)
    ```
    """

    step: int
    num_replicas: int
    num_workers: int
    num_variables: int
    variables: tuple[VariableReport, ...] = ()

    def _tier(self, tier: str) -> tuple[VariableReport, ...]:
        return tuple(v for v in self.variables if v.tier == tier)

    @property
    def divergences(self) -> tuple[VariableReport, ...]:
        """The `VariableReport`s of the "divergence" tier."""
        return self._tier(DIVERGENCE)

    @property
    def float_drift(self) -> tuple[VariableReport, ...]:
        """The `VariableReport`s within `atol`/`rtol`."""
        return self._tier(FLOAT_DRIFT)

    @property
    def per_replica_state(self) -> tuple[VariableReport, ...]:
        """The `VariableReport`s of per-replica state."""
        return self._tier(PER_REPLICA_STATE)

    @property
    def ok(self) -> bool:
        """True when no variable diverged."""
        return not self.divergences

    @property
    def max_abs_diff(self) -> float:
        """The largest absolute difference among diverged and drifting variables."""
        values = [v.difference.max_abs_diff for v in self.divergences + self.float_drift]
        return max(values, default=0.0)

    def __str__(self) -> str:
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
