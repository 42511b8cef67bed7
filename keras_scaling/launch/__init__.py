"""Local multi-worker jobs: `keras-scaling launch` and `keras_scaling.launcher`; no TensorFlow."""
