"""`ReplicaStateChecker`: fingerprints every replica's copies on the devices and compares them."""

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from keras_scaling import _validation
from keras_scaling.devices import _topology
from keras_scaling.replica_sync import _copy_comparison, _fingerprint
from keras_scaling.replica_sync._copy_comparison import ReplicaSyncReport

if TYPE_CHECKING:
    from keras_scaling.replica_sync._tracked_variables import TrackedVariable


class ReplicaStateChecker:
    """Compares every replica's copy of a list of distributed variables, by their fingerprints.

    Under several workers `check()` and `resync()` are collective: every worker calls them at once.

    Args:
        strategy: the `tf.distribute.Strategy` the variables belong to.
        variables: a list of `TrackedVariable`.
        atol: float, absolute tolerance of the "float drift" tier.
        rtol: float, relative tolerance of the "float drift" tier.
        per_replica_state: `"warn"`, `"ignore"` (not compared), `"error"` (divergence) or
            `"average"` (copies replaced by their mean after the comparison).

    Example:

    ```python
    keras_scaling.use_logical_cpus(2)
    strategy = keras_scaling.auto_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    checker = ReplicaStateChecker(strategy, keras_scaling.replica_state.tracked_variables(model))
    print(checker.check(step=0))   # ... 0 diverged, 0 with float drift, 0 per-replica state differ
    ```
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        variables: "Iterable[TrackedVariable]",
        atol: float = 0.0,
        rtol: float = 0.0,
        per_replica_state: str = "warn",
    ) -> None:
        self.per_replica_state = _validation.one_of(
            per_replica_state, "per_replica_state", _copy_comparison.PER_REPLICA_STATE_MODES
        )
        self.atol = _validation.non_negative_number(atol, "atol")
        self.rtol = _validation.non_negative_number(rtol, "rtol")
        self.strategy = strategy
        if per_replica_state == "ignore":
            variables = [v for v in variables if not v.is_per_replica_state]
        self.variables = list(variables)
        self.num_replicas = _topology.num_replicas(strategy)
        self.num_workers = _topology.num_workers(strategy)
        self.replica_devices = _topology.replica_device_names(strategy)
        self._fingerprint_function: Callable[[], Any] | None = None
        self._gather_functions: dict[tuple[int, ...], Callable[[], Any]] = {}

    def _on_every_replica(self, replica_fn: Callable[[], Any]) -> Callable[[], Any]:
        strategy = self.strategy
        return tf.function(lambda: strategy.run(replica_fn), autograph=False)

    def fingerprints(self) -> np.ndarray:
        """The int64 table `[num_replicas, num_variables]` of fingerprints.

        Returns:
            A NumPy array; row `r` holds replica `r`'s fingerprints.
        """
        if not self.variables:
            return np.zeros([self.num_replicas, 0], np.int64)
        if self._fingerprint_function is None:
            tf_variables = [v.variable for v in self.variables]
            across_workers = self.num_workers > 1

            def replica_fn() -> tf.Tensor:
                table = _fingerprint.fingerprint_table([tf.identity(v) for v in tf_variables])
                if not across_workers:
                    return table
                context = tf.distribute.get_replica_context()
                return context.all_gather(table[tf.newaxis], axis=0)

            self._fingerprint_function = self._on_every_replica(replica_fn)
        local = self.strategy.experimental_local_results(self._fingerprint_function())
        if self.num_workers > 1:
            return local[0].numpy()
        # Every row is local: no collective (its keys would clash with another MirroredStrategy's).
        return np.stack([row.numpy() for row in local])

    def gather(self, indices: Sequence[int]) -> list[list[np.ndarray]]:
        """Every replica's copy of `self.variables[i]` for `i` in `indices`.

        Args:
            indices: a sequence of indices into `self.variables`.

        Returns:
            Per index, a list of NumPy arrays, replica 0 first (all workers).
        """
        indices = tuple(indices)
        if not indices:
            return []
        local = self.strategy.experimental_local_results
        if self.num_workers == 1:
            copies = [local(self.variables[i].variable) for i in indices]
            return [[np.asarray(copy.numpy()) for copy in variable] for variable in copies]
        if indices not in self._gather_functions:
            chosen = [self.variables[i].variable for i in indices]

            def replica_fn() -> list[tf.Tensor]:
                context = tf.distribute.get_replica_context()
                return [context.all_gather(tf.identity(v)[tf.newaxis], axis=0) for v in chosen]

            self._gather_functions[indices] = self._on_every_replica(replica_fn)
        return [list(local(values)[0].numpy()) for values in self._gather_functions[indices]()]

    def check(self, step: int) -> ReplicaSyncReport:
        """Compares the copies now (averaging per-replica state with `"average"`).

        Args:
            step: int, the optimizer step to put in the report.

        Returns:
            A `ReplicaSyncReport`.
        """
        suspects = _copy_comparison.differing_columns(self.fingerprints())
        reports = []
        for index, copies in zip(suspects, self.gather(suspects)):
            variable = self.variables[index]
            difference = _copy_comparison.compare_copies(copies, self.atol, self.rtol)
            if not difference.differing_replicas:  # assigned since the (deterministic) fingerprints
                continue
            tier = _copy_comparison.tier_of(
                variable.is_per_replica_state, self.per_replica_state, difference
            )
            repair = None
            if tier == _copy_comparison.PER_REPLICA_STATE and self.per_replica_state == "average":
                self._assign_everywhere(variable, _copy_comparison.mean_copy(copies))
                repair = "averaged across replicas"
            reports.append(
                _copy_comparison.VariableReport(
                    path=variable.path,
                    shape=variable.shape,
                    dtype=variable.dtype,
                    aggregation=variable.aggregation,
                    synchronization=variable.synchronization,
                    role=variable.role,
                    tier=tier,
                    difference=difference,
                    devices=tuple(self.replica_devices[r] for r in difference.differing_replicas),
                    likely_cause=_copy_comparison.likely_cause(variable, difference),
                    repair=repair,
                )
            )
        counts = (self.num_replicas, self.num_workers, len(self.variables))
        return ReplicaSyncReport(int(step), *counts, variables=tuple(reports))

    def resync(self, report: ReplicaSyncReport) -> ReplicaSyncReport:
        """Copies replica 0's value to every replica for the diverged variables.

        Args:
            report: a `ReplicaSyncReport` from this checker's `check()`.

        Returns:
            A new report whose diverged variables say they were resynced.
        """
        by_path = {v.path: i for i, v in enumerate(self.variables)}
        indices = [by_path[v.path] for v in report.divergences]
        for index, copies in zip(indices, self.gather(indices)):
            self._assign_everywhere(self.variables[index], copies[0])
        repaired = tuple(
            dataclasses.replace(v, repair="resynced from replica 0")
            if v.tier == _copy_comparison.DIVERGENCE
            else v
            for v in report.variables
        )
        return dataclasses.replace(report, variables=repaired)

    def _assign_everywhere(self, variable: "TrackedVariable", value: np.ndarray) -> None:
        for component in self.strategy.experimental_local_results(variable.variable):
            component.assign(value)
