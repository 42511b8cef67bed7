"""`keras_scaling.utilization`, the import path of keras_scaling 0.1: every name of `keras_scaling.mfu.utilization`."""

from keras_scaling.mfu.utilization import *  # noqa: F403
from keras_scaling.mfu.utilization import __all__  # noqa: F401
