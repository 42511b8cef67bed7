"""`keras_scaling.replica_state`, the import path of keras_scaling 0.1: every name of `keras_scaling.replica_sync.replica_state`."""

from keras_scaling.replica_sync.replica_state import *  # noqa: F403
from keras_scaling.replica_sync.replica_state import __all__  # noqa: F401
