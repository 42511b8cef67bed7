"""`keras_scaling.peak_flops`, the import path of keras_scaling 0.1: every name of `keras_scaling.mfu.peak_flops`."""

from keras_scaling.mfu.peak_flops import *  # noqa: F403
from keras_scaling.mfu.peak_flops import __all__  # noqa: F401
