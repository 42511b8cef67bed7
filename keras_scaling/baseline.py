"""`keras_scaling.baseline`, the import path of keras_scaling 0.1: every name of `keras_scaling.throughput.baseline`."""

from keras_scaling.throughput.baseline import *  # noqa: F403
from keras_scaling.throughput.baseline import __all__  # noqa: F401
