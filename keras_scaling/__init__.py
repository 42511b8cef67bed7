"""keras_scaling: correct, fast and visible data-parallel Keras training.

Composable pieces for ordinary Keras code on `tf.distribute`:

- `keras_scaling.data.distribute`: shard per worker, batch globally, prefetch,
  static shapes.
- `ReplicaSyncCheck`: a callback that proves the mirrored copies of every
  weight are equal, and says exactly what diverged.
- `ThroughputLogger`: a callback that writes throughput, speedup and scaling
  efficiency to TensorBoard.
- `keras_scaling.compat`: fixes for Keras 3 defects that break `fit` under
  `tf.distribute`.
- `use_logical_cpus`, `auto_strategy`, `describe_strategy`: devices and
  strategies; `keras_scaling.cluster`: the multi-worker cluster from Slurm,
  Kubernetes or `TF_CONFIG`.
- `explain(model, data)`: the training step split into input, compute,
  synchronization and host overhead, with a verdict and the fix.

Names are imported on first use, so `import keras_scaling` is cheap and does
not initialise TensorFlow's devices: `use_logical_cpus` can still follow it.
"""

import importlib

from keras_scaling.internals import _versions

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
_SUBMODULES = (
    "baseline",
    "callbacks",
    "cluster",
    "compat",
    "data",
    "devices",
    "doctor",
    "explain",
    "flops",
    "launch",
    "launcher",
    "mfu",
    "peak_flops",
    "preemption",
    "replica_state",
    "replica_sync",
    "throughput",
    "utilization",
)

__all__ = sorted(_EXPORTS) + list(_SUBMODULES)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"keras_scaling.{name}")
    else:
        raise AttributeError(f"module 'keras_scaling' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
