"""The guarded reaches into Keras' and TensorFlow's private names, in one place.

`_probes` (the registry and its one warning), `_versions` (the installed and
supported versions), `_keras` (layers, optimizers, variables), `_tf_data` and
`_tf_data_batching` (datasets, iterators, specs). `keras_scaling.compat`
reads the trainer's private names through the same probes.
"""
