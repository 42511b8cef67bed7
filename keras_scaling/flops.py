"""`keras_scaling.flops`, the import path of keras_scaling 0.1: every name of `keras_scaling.mfu.flops`."""

from keras_scaling.mfu.flops import *  # noqa: F403
from keras_scaling.mfu.flops import __all__  # noqa: F401
