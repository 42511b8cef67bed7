"""How the copies of a variable differ between replicas: pure NumPy, no model or strategy."""

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

DIVERGENCE = "divergence"
FLOAT_DRIFT = "float drift"
PER_REPLICA_STATE = "per-replica state"
PER_REPLICA_STATE_MODES = ("warn", "ignore", "error", "average")
TRAINABLE = "trainable"
NON_TRAINABLE = "non-trainable"
SEED_GENERATOR = "seed generator state"
OPTIMIZER_ITERATIONS = "optimizer iteration counter"
OPTIMIZER_VARIABLE = "optimizer variable"
GRADIENT_ACCUMULATOR = "gradient accumulator"

_CAUSE_OF_ROLE = {
    OPTIMIZER_ITERATIONS: "optimizer steps were applied on some replicas only (a custom train_step?)",
    TRAINABLE: "gradients were not combined across replicas before the update (keras-team/keras#19891), or a custom train_step assigns the weight per replica",
    OPTIMIZER_VARIABLE: "optimizer state was updated with per-replica gradients (a custom train_step?)",
    SEED_GENERATOR: "the seed generator advanced unevenly (random ops in replica-dependent control flow)",
}


@dataclasses.dataclass(frozen=True)
class CopyDifference:
    """How the copies of one variable differ from replica 0's copy.

    Args:
        differing_replicas: the replicas whose copy is not bitwise replica 0's.
        num_differing_elements: elements that differ on at least one replica.
        num_elements: elements in the variable.
        max_abs_diff: the largest `|copy - copy_0|` (inf for a NaN on one replica only).
        max_rel_diff: the largest `|copy - copy_0| / |copy_0|`.
        nan_counts, inf_counts: NaN and Inf elements in each replica's copy.
        within_tolerance: every difference is within `atol + rtol * |copy_0|` (never with both 0).

    Example:

    ```python
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
    return array.view(f"u{array.dtype.itemsize}") if array.dtype.itemsize <= 8 else array


def _non_finite_counts(array: np.ndarray) -> tuple[int, int]:
    if not (np.issubdtype(array.dtype, np.inexact) or array.dtype.name == "bfloat16"):
        return 0, 0
    values = array.astype(np.complex128 if np.iscomplexobj(array) else np.float64)
    return int(np.isnan(values).sum()), int(np.isinf(values).sum())


def compare_copies(
    copies: Sequence[np.ndarray], atol: float = 0.0, rtol: float = 0.0
) -> CopyDifference:
    """Compares every replica's copy of a variable with replica 0's, bitwise (`-0.0 != 0.0`).

    Args:
        copies: NumPy arrays of one shape and dtype, replica 0 first.
        atol: float, absolute tolerance of the "float drift" tier.
        rtol: float, relative tolerance of the "float drift" tier.

    Returns:
        A `CopyDifference`.

    Example:

    ```python
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
    """The columns of a `[num_replicas, num_variables]` table that differ between rows."""
    table = np.asarray(fingerprint_table)
    return [int(i) for i in np.flatnonzero(np.any(table != table[:1], axis=0))]


def tier_of(per_replica_state: bool, mode: str, difference: CopyDifference) -> str:
    """`PER_REPLICA_STATE` (unless the mode is "error"), `FLOAT_DRIFT` or `DIVERGENCE`."""
    if per_replica_state and mode != "error":
        return PER_REPLICA_STATE
    if difference.within_tolerance:
        return FLOAT_DRIFT
    return DIVERGENCE


def mean_copy(copies: Sequence[np.ndarray]) -> np.ndarray:
    """The element-wise mean in replica 0's dtype, taken in float64 (no float16 overflow), rounded for integers."""
    reference = np.asarray(copies[0])
    mean = np.mean(np.stack(copies).astype(np.float64), axis=0)
    if np.issubdtype(reference.dtype, np.integer):
        mean = np.rint(mean)
    return mean.astype(reference.dtype)


def likely_cause(variable: Any, difference: CopyDifference) -> str:
    """What usually makes a variable's copies differ like this, in one sentence.

    Args:
        variable: a `TrackedVariable` (or anything with its `role`, `aggregation`, `per_replica_reason`).
        difference: its `CopyDifference`.

    Returns:
        str; NaN or Inf on some replicas only is named first.

    Example:

    ```python
    kernel = keras_scaling.replica_state.TrackedVariable("kernel", tf.Variable([1.0]), "trainable")
    difference = compare_copies([np.float32([1, 2]), np.float32([1, 3])])
    print(likely_cause(kernel, difference))   # gradients were not combined ...
    ```
    """
    non_finite = [nan + inf for nan, inf in zip(difference.nan_counts, difference.inf_counts)]
    if any(non_finite) and not all(non_finite):
        replicas = ", ".join(str(i) for i, count in enumerate(non_finite) if count)
        return f"NaN/Inf on replica(s) {replicas} only: non-finite gradients from that replica's batch (check its inputs and loss, or lower the learning rate)"
    if variable.per_replica_reason is not None:
        return variable.per_replica_reason
    if difference.within_tolerance:
        return "float drift: tiny differences, as from a non-deterministic reduction order"
    if variable.role in _CAUSE_OF_ROLE:
        return _CAUSE_OF_ROLE[variable.role]
    if variable.aggregation == "NONE":
        return "a weight with aggregation 'none' assigned in replica context updates each replica's own copy (tensorflow/tensorflow#37834): give it aggregation='mean'"
    return f"a weight with aggregation {variable.aggregation.lower()!r} assigned from replica-local values or on some replicas only"


@dataclasses.dataclass(frozen=True)
class VariableReport:
    """One variable whose copies differ between replicas.

    Args:
        path, shape, dtype, aggregation, synchronization, role: the variable's (`TrackedVariable`).
        tier: `"divergence"`, `"float drift"` or `"per-replica state"`.
        difference: the `CopyDifference`.
        devices: the device of each differing replica.
        likely_cause: one sentence on what usually causes this.
        repair: `"averaged across replicas"`, `"resynced from replica 0"` or None.

    Example:

    ```python
    difference = compare_copies([np.float32([0.0]), np.float32([0.5])])
    report = VariableReport("dense/bias", (1,), "float32", "MEAN", "ON_WRITE",
                            "trainable", "divergence", difference, ("CPU:1",), "a cause")
    print(report)   # DIVERGENCE: dense/bias shape=(1,) ... max abs diff 0.5, ...
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
        replicas = ", ".join(f"{r} ({d})" for r, d in zip(diff.differing_replicas, self.devices))
        lines = [
            f"{self.tier.upper()}: {self.path} shape={self.shape} dtype={self.dtype} "
            f"aggregation={self.aggregation} synchronization={self.synchronization} ({self.role})",
            f"  replicas differing from replica 0: {replicas}",
            f"  max abs diff {diff.max_abs_diff:.6g}, max rel diff {diff.max_rel_diff:.6g}, "
            f"{diff.num_differing_elements} of {diff.num_elements} elements differ",
        ]
        if any(diff.nan_counts) or any(diff.inf_counts):
            counts = enumerate(zip(diff.nan_counts, diff.inf_counts))
            text = ", ".join(f"replica {i}: {nan} NaN/{inf} Inf" for i, (nan, inf) in counts)
            lines.append(f"  non-finite values: {text}")
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
        variables: a `VariableReport` per variable whose copies differ.

    Example:

    ```python
    report = ReplicaSyncReport(step=8, num_replicas=2, num_workers=1, num_variables=4)
    print(report.ok, report)   # True Replica sync check at step 8: 4 variables on 2 replicas ...
    ```
    """

    step: int
    num_replicas: int
    num_workers: int
    num_variables: int
    variables: tuple[VariableReport, ...] = ()

    @property
    def divergences(self) -> tuple[VariableReport, ...]:
        """The `VariableReport`s of the "divergence" tier."""
        return tuple(v for v in self.variables if v.tier == DIVERGENCE)

    @property
    def float_drift(self) -> tuple[VariableReport, ...]:
        """The `VariableReport`s within `atol`/`rtol`."""
        return tuple(v for v in self.variables if v.tier == FLOAT_DRIFT)

    @property
    def per_replica_state(self) -> tuple[VariableReport, ...]:
        """The `VariableReport`s of per-replica state."""
        return tuple(v for v in self.variables if v.tier == PER_REPLICA_STATE)

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
            f"Replica sync check at step {self.step}: {self.num_variables} variables on "
            f"{self.num_replicas} replicas ({self.num_workers} {workers}): "
            f"{len(self.divergences)} diverged, {len(self.float_drift)} with float drift, "
            f"{len(self.per_replica_state)} per-replica state differ"
        )
        reports = self.divergences + self.float_drift + self.per_replica_state
        return "\n".join([head] + [str(v) for v in reports])
