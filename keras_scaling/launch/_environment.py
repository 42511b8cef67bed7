"""Environment variables that one keras_scaling process sets for another.

Plain constants, importing nothing: `launcher` (which must not import
TensorFlow) sets them for every worker it starts, `devices` reads them.
"""

# The logical CPUs each worker splits its CPU into, as
# `keras-scaling launch --cpu-devices K` asks; read by `auto_strategy`.
CPU_DEVICES_ENV = "KERAS_SCALING_CPU_DEVICES"

# Set by `keras-scaling launch` for every worker, so that the cluster's
# origin (`keras_scaling.cluster.describe_cluster`) says who wrote TF_CONFIG.
LAUNCHED_ENV = "KERAS_SCALING_LAUNCHED"
