"""Keras callbacks of keras_scaling: `ReplicaSyncCheck` and `ThroughputLogger`."""

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
    "BackupAndRestore": "keras_scaling.callbacks.backup_and_restore",
    "ReplicaSyncCheck": "keras_scaling.callbacks.replica_sync",
    "ReplicaDivergenceError": "keras_scaling.callbacks.replica_sync",
    "ThroughputLogger": "keras_scaling.callbacks.throughput",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'keras_scaling.callbacks' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
