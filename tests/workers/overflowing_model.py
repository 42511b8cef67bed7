"""A `mixed_float16` model whose first step overflows on one replica only (the `loss_scale_finite` fix).

Keras' `LossScaleOptimizer` at its default scale (2**15) and constant initial
weights; in the data, the samples of the first batch from `first_overflowing`
on are 1000 times larger, so only the replicas that read them overflow.
Shared by tests/test_compat_mirrored.py and the multi-worker scenario
(tests/multi_worker/mw_loss_scale_worker.py).
"""

import keras
import numpy as np


def build(strategy):
    constant = keras.initializers.Constant
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(
                    8, activation="relu", dtype="mixed_float16", kernel_initializer=constant(0.1)
                ),
                keras.layers.Dense(1, dtype="float32", kernel_initializer=constant(0.2)),
            ]
        )
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
        model.compile(optimizer=optimizer, loss="mse")
    return model


def data(num_samples, global_batch_size, first_overflowing):
    """`(x, y)` of a linear target, the first batch's samples `first_overflowing:` scaled up."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_samples, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1)) + 0.1).astype("float32")
    x[first_overflowing:global_batch_size] *= 1000
    return x, y
