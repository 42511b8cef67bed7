"""Throughput, speedup and scaling efficiency: `ThroughputLogger` and what it stands on.

Gathers the names of `keras_scaling.throughput.arithmetic`, as in keras_scaling 0.1.
"""

from keras_scaling.throughput.arithmetic import *  # noqa: F403
from keras_scaling.throughput.arithmetic import __all__  # noqa: F401
