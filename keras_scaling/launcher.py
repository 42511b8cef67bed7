"""`keras_scaling.launcher`, the import path of keras_scaling 0.1: every name of `keras_scaling.launch.launcher`."""

from keras_scaling.launch.launcher import *  # noqa: F403
from keras_scaling.launch.launcher import __all__  # noqa: F401
