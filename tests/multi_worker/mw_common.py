"""Pieces shared by the worker scripts that the multi-worker tests launch.

Each worker script runs under `keras-scaling launch`, so `TF_CONFIG` makes
`keras_scaling.auto_strategy()` a `MultiWorkerMirroredStrategy`. A worker
writes what it saw to `--out-dir` (JSON and NumPy files named after its
index) for the test to compare across workers.
"""

import json
import os
import threading

import numpy as np

NUM_FEATURES = 4


def write_json(path, payload):
    """Writes `payload` to `path` atomically: the test never reads half a file."""
    partial = f"{path}.partial"
    with open(partial, "w") as file:
        json.dump(payload, file)
    os.replace(partial, path)


def record_pid(out_dir, name):
    """Records this process's pid, so the test can check that it is gone."""
    with open(os.path.join(out_dir, f"{name}.pid"), "w") as file:
        file.write(str(os.getpid()))


def make_data(num_samples, seed=0):
    """Regression data whose first column is the sample's id (0, 1, ...)."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(num_samples, NUM_FEATURES)).astype("float32")
    true_kernel = np.arange(1, NUM_FEATURES + 1, dtype="float32")[:, None] / 4
    y = features @ true_kernel + 0.1 * rng.normal(size=(num_samples, 1))
    ids = np.arange(num_samples, dtype="float32")[:, None]
    return np.concatenate([ids, features], axis=1), y.astype("float32")


class IdRecorder:
    """Collects, per epoch, the sample ids the replicas of this worker trained on."""

    def __init__(self):
        self.ids_by_epoch = {}
        self.epoch = 0
        self._lock = threading.Lock()

    def record(self, ids):
        with self._lock:
            self.ids_by_epoch.setdefault(self.epoch, []).extend(int(value) for value in ids.numpy())


def build_model(recorder=None, jit_compile=False):
    """A small MLP on the features; the id column only feeds `recorder`."""
    import keras
    import tensorflow as tf

    class DropIds(keras.layers.Layer):
        def call(self, inputs, training=None):
            if training and recorder is not None:
                # Runs on each replica with the ids of its own slice of the batch.
                tf.py_function(recorder.record, [inputs[:, 0]], Tout=[])
            return inputs[:, 1:]

    model = keras.Sequential(
        [
            keras.Input((NUM_FEATURES + 1,)),
            DropIds(),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss="mse",
        weighted_metrics=["mae"],
        jit_compile=jit_compile,
    )
    return model


def local_copies(strategy, variables):
    """`{path: [this worker's copy on each local replica, as NumPy]}`."""
    return {
        variable.path: [
            np.asarray(copy.numpy()) for copy in strategy.experimental_local_results(variable.value)
        ]
        for variable in variables
    }
