"""keras_scaling: correct, fast and visible data-parallel Keras training on `tf.distribute`.

Names are imported on first use, so `import keras_scaling` is cheap and does
not initialise TensorFlow's devices: `use_logical_cpus` can still follow it.
The guides in docs/guides/ show each piece.
"""

import importlib
from typing import TYPE_CHECKING

from keras_scaling.internals import _versions

if TYPE_CHECKING:
    # What `__getattr__` imports on first use, spelled out for type checkers.
    from keras_scaling import baseline as baseline
    from keras_scaling import callbacks as callbacks
    from keras_scaling import cluster as cluster
    from keras_scaling import compat as compat
    from keras_scaling import data as data
    from keras_scaling import devices as devices
    from keras_scaling import doctor as doctor
    from keras_scaling import explain as explain
    from keras_scaling import flops as flops
    from keras_scaling import launcher as launcher
    from keras_scaling import peak_flops as peak_flops
    from keras_scaling import replica_state as replica_state
    from keras_scaling import throughput as throughput
    from keras_scaling import tune as tune
    from keras_scaling import utilization as utilization
    from keras_scaling.callbacks.backup_and_restore import BackupAndRestore as BackupAndRestore
    from keras_scaling.callbacks.replica_sync import (
        ReplicaDivergenceError as ReplicaDivergenceError,
    )
    from keras_scaling.callbacks.replica_sync import ReplicaSyncCheck as ReplicaSyncCheck
    from keras_scaling.callbacks.throughput import ThroughputLogger as ThroughputLogger
    from keras_scaling.devices import StrategyInfo as StrategyInfo
    from keras_scaling.devices import auto_strategy as auto_strategy
    from keras_scaling.devices import describe_strategy as describe_strategy
    from keras_scaling.devices import use_logical_cpus as use_logical_cpus

_versions.check_supported()

__version__ = "0.1.0"  # pyproject.toml reads the version from here

_EXPORTS = {
    "BackupAndRestore": "keras_scaling.preemption.backup_and_restore",
    "use_logical_cpus": "keras_scaling.devices",
    "auto_strategy": "keras_scaling.devices",
    "describe_strategy": "keras_scaling.devices",
    "StrategyInfo": "keras_scaling.devices",
    "ReplicaSyncCheck": "keras_scaling.replica_sync.replica_sync_check",
    "ReplicaDivergenceError": "keras_scaling.replica_sync.replica_sync_check",
    "ThroughputLogger": "keras_scaling.throughput.throughput_logger",
}
_SUBMODULES = tuple(
    "baseline callbacks cluster compat data devices doctor explain flops launch launcher mfu "
    "peak_flops preemption replica_state replica_sync throughput tune utilization".split()
)

__all__ = sorted(_EXPORTS) + list(_SUBMODULES)


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"keras_scaling.{name}")
    else:
        raise AttributeError(f"module 'keras_scaling' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
