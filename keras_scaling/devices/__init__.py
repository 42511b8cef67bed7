"""Devices and strategies: which strategy to train with (`strategies`), and its workers, replicas
and devices (`_topology`), loaded lazily: `compat` imports `_topology`, strategies enable it."""

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

_EXPORTS = dict.fromkeys(
    "StrategyInfo auto_strategy describe_strategy strategy_kind tf_config use_logical_cpus warn_if_keras_distribution_set".split(),
    "keras_scaling.devices.strategies",
)
_EXPORTS |= dict.fromkeys(
    "is_chief num_replicas num_workers replica_device_names replicas_per_worker worker_index".split(),
    "keras_scaling.devices._topology",
)

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'keras_scaling.devices' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
