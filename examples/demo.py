"""Placeholder demo: replaced by the bench."""
import keras_scaling
keras_scaling.use_logical_cpus(4)
print(keras_scaling.describe_strategy(keras_scaling.auto_strategy()))
