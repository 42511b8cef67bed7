"""`keras_scaling.callbacks.throughput`, the import path of keras_scaling 0.1: every name of `keras_scaling.throughput.throughput_logger`."""

from keras_scaling.throughput.throughput_logger import *  # noqa: F403
from keras_scaling.throughput.throughput_logger import __all__  # noqa: F401
