"""`keras_scaling.callbacks.backup_and_restore`, the import path of keras_scaling 0.1: every name of `keras_scaling.preemption.backup_and_restore`."""

from keras_scaling.preemption.backup_and_restore import *  # noqa: F403
from keras_scaling.preemption.backup_and_restore import __all__  # noqa: F401
