"""Devices and strategies: which strategy to train with, and its workers, replicas and devices.

- `strategies`: making and describing strategies (`use_logical_cpus`,
  `auto_strategy`, `describe_strategy`, `StrategyInfo`, `tf_config`);
- `_topology`: counting a strategy's workers, replicas and devices (plain
  functions of a `tf.distribute.Strategy`, importing nothing else of
  keras_scaling, so that `keras_scaling.compat` can use them too).

Names are imported on first use, as from `keras_scaling` itself: importing
`keras_scaling.devices._topology` does not load the strategies, which
enable `keras_scaling.compat`, which counts replicas with `_topology`.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # What `__getattr__` imports on first use, spelled out for type checkers.
    from keras_scaling.devices._topology import is_chief as is_chief
    from keras_scaling.devices._topology import num_replicas as num_replicas
    from keras_scaling.devices._topology import num_workers as num_workers
    from keras_scaling.devices._topology import replica_device_names as replica_device_names
    from keras_scaling.devices._topology import replicas_per_worker as replicas_per_worker
    from keras_scaling.devices.strategies import StrategyInfo as StrategyInfo
    from keras_scaling.devices.strategies import auto_strategy as auto_strategy
    from keras_scaling.devices.strategies import describe_strategy as describe_strategy
    from keras_scaling.devices.strategies import strategy_kind as strategy_kind
    from keras_scaling.devices.strategies import tf_config as tf_config
    from keras_scaling.devices.strategies import use_logical_cpus as use_logical_cpus
    from keras_scaling.devices.strategies import (
        warn_if_keras_distribution_set as warn_if_keras_distribution_set,
    )

_STRATEGIES = "keras_scaling.devices.strategies"
_TOPOLOGY = "keras_scaling.devices._topology"
_EXPORTS = {
    "StrategyInfo": _STRATEGIES,
    "auto_strategy": _STRATEGIES,
    "describe_strategy": _STRATEGIES,
    "is_chief": _TOPOLOGY,
    "num_replicas": _TOPOLOGY,
    "num_workers": _TOPOLOGY,
    "replica_device_names": _TOPOLOGY,
    "replicas_per_worker": _TOPOLOGY,
    "strategy_kind": _STRATEGIES,
    "tf_config": _STRATEGIES,
    "use_logical_cpus": _STRATEGIES,
    "warn_if_keras_distribution_set": _STRATEGIES,
    "worker_index": _TOPOLOGY,
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'keras_scaling.devices' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
