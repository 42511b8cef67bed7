"""Environment variables one keras_scaling process sets for another; imports nothing."""

# The logical CPUs each worker splits its CPU into (`launch --cpu-devices`).
CPU_DEVICES_ENV = "KERAS_SCALING_CPU_DEVICES"

# Set for `launch`'s workers, so `describe_cluster` names it as TF_CONFIG's origin.
LAUNCHED_ENV = "KERAS_SCALING_LAUNCHED"
