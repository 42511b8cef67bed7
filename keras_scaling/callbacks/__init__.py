"""Keras callbacks of keras_scaling: `ThroughputLogger`, `ReplicaSyncCheck`, `BackupAndRestore`.

Each callback lives with its feature (`keras_scaling.throughput`,
`keras_scaling.replica_sync`, `keras_scaling.preemption`); its class is
importable from here too, and `keras_scaling.callbacks.throughput`,
`.replica_sync` and `.backup_and_restore` keep the import paths of 0.1. What
the callbacks share to hook into `fit` is `keras_scaling.fit_hooks`.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # What `__getattr__` imports on first use, spelled out for type checkers.
    from keras_scaling.callbacks.backup_and_restore import BackupAndRestore as BackupAndRestore
    from keras_scaling.callbacks.replica_sync import (
        ReplicaDivergenceError as ReplicaDivergenceError,
    )
    from keras_scaling.callbacks.replica_sync import ReplicaSyncCheck as ReplicaSyncCheck
    from keras_scaling.callbacks.throughput import ThroughputLogger as ThroughputLogger

_EXPORTS = {
    "BackupAndRestore": "keras_scaling.preemption.backup_and_restore",
    "ReplicaSyncCheck": "keras_scaling.replica_sync.replica_sync_check",
    "ReplicaDivergenceError": "keras_scaling.replica_sync.replica_sync_check",
    "ThroughputLogger": "keras_scaling.throughput.throughput_logger",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'keras_scaling.callbacks' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
