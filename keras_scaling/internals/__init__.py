"""The guarded reaches into Keras' and TensorFlow's private names (`_probes`), in one place."""
