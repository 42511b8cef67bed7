"""Local multi-worker jobs: `keras-scaling launch` and `keras_scaling.launcher`.

Plain Python, no TensorFlow: a launcher starts workers, it does not train.

- `launcher`: start N local workers of one command, as a group;
- `_isolation`: a private network namespace with only loopback for them;
- `_environment`: the environment variables one keras_scaling process sets
  for another.
"""
