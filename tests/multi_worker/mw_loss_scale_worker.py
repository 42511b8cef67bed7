"""Worker of the mixed precision scenario on 2 workers: an overflow on the last replica only.

A `mixed_float16` layer and Keras' `LossScaleOptimizer` (scale 2**15) train one
epoch of 6 steps of 16 samples, in order; the first batch's last 4 samples,
the last replica's share on worker 1, are 1000 times larger, so only that
replica's gradients overflow at the first step. Writes `worker{i}.json`.
"""

import hashlib
import os

import keras
import mw_common
import numpy as np

import keras_scaling

GLOBAL_BATCH_SIZE = 16
NUM_SAMPLES = 96


def loss_scale(strategy, out_dir):
    index = keras_scaling.describe_strategy(strategy).worker_index
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_SAMPLES, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1)) + 0.1).astype("float32")
    x[GLOBAL_BATCH_SIZE * 3 // 4 : GLOBAL_BATCH_SIZE] *= 1000
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
    data = keras_scaling.data.distribute(
        (x, y), strategy=strategy, global_batch_size=GLOBAL_BATCH_SIZE, shuffle=False
    )
    model.fit(data, epochs=1, verbose=0)
    copies = list(mw_common.local_copies(strategy, model.variables).values())
    mw_common.write_json(
        os.path.join(out_dir, f"worker{index}.json"),
        {
            "updates": int(model.optimizer.inner_optimizer.iterations.numpy()),
            "loss_scale": float(model.optimizer.dynamic_scale.numpy()),
            "finite": all(bool(np.isfinite(c).all()) for local in copies for c in local),
            "replicas_equal": all(np.array_equal(c, local[0]) for local in copies for c in local),
            "digest": hashlib.sha256(b"".join(local[0].tobytes() for local in copies)).hexdigest(),
        },
    )
