"""A model whose steps sleep 20 ms beside a Dense layer, for the tests that run tune.

Tune's rounds last as long as with a real model, but leave the cores to the
rest of the test run.
"""

import time

import numpy as np


def sleep_layer():
    """A layer that passes its input on after a 20 ms sleep in each step."""
    import keras
    import tensorflow as tf

    def sleep():
        time.sleep(0.02)
        return np.float32(0)

    class Sleep(keras.layers.Layer):
        def call(self, x):
            with tf.control_dependencies([tf.py_function(sleep, [], tf.float32)]):
                return tf.identity(x)

    return Sleep()


def build():
    """The model of `keras-scaling tune --model sleeping_models:build`."""
    import keras

    return keras.Sequential([keras.Input((8,)), sleep_layer(), keras.layers.Dense(1)])
