"""`keras_scaling.callbacks.replica_sync`, the import path of keras_scaling 0.1: every name of `keras_scaling.replica_sync.replica_sync_check`."""

from keras_scaling.replica_sync.replica_sync_check import *  # noqa: F403
from keras_scaling.replica_sync.replica_sync_check import __all__  # noqa: F401
