"""Trains with a keras_scaling piece while some of its probes fail.

`tests/test_probes_mirrored.py` calls the scenarios in its own process (2
logical CPUs); the multi-worker one runs as a script, since `TF_CONFIG` must
be set before TensorFlow starts:

    KERAS_SCALING_FAIL_PROBES=name,... python tests/workers/probe_scenario.py OUT_DIR

Scenarios (2 replicas of MirroredStrategy):
- `throughput`: `ThroughputLogger` on arrays whose last batch is partial, and
  on a `keras_scaling.data.distribute` dataset.
- `replica_sync`: `ReplicaSyncCheck` on a model with BatchNormalization and
  Dropout, trained with Adam.
- `compat`: `fit` with `steps_per_execution=1`, and what compat reports.
- `multi_worker_devices`: MultiWorkerMirroredStrategy over 2 logical CPUs
  with a one-worker `TF_CONFIG`; the script prints its report as JSON.
"""

import json
import logging
import os
import re
import sys

import keras  # noqa: E402
import numpy as np

import keras_scaling
from keras_scaling import compat, data  # noqa: E402


class WarningCollector(logging.Handler):
    """Keeps the messages of the warnings logged on the `keras_scaling` logger."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("keras_scaling").addHandler(self)
        return self

    def __exit__(self, *exc_info):
        logging.getLogger("keras_scaling").removeHandler(self)


def regression(num_samples, features=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_samples, features)).astype("float32")
    y = (x @ rng.normal(size=(features, 1))).astype("float32")
    return x, y


def mlp(strategy, features=4, steps_per_execution=1):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((features,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse", steps_per_execution=steps_per_execution)
    return model


def trained(history, epochs):
    loss = history.history["loss"]
    return len(loss) == epochs and bool(np.all(np.isfinite(loss)))


def throughput_record(log_dir):
    path = os.path.join(log_dir, keras_scaling.throughput.baseline.THROUGHPUT_JSON)
    if not os.path.exists(path):
        return {"global_batch_size": None, "samples_per_sec": None}
    return keras_scaling.throughput.baseline.read_throughput_json(path)


def throughput(strategy, out_dir):
    x, y = regression(1000)
    model = mlp(strategy)
    arrays_dir = os.path.join(out_dir, "arrays")
    logger = keras_scaling.ThroughputLogger(
        log_dir=arrays_dir, update_freq=5, warmup_steps=2, baseline=None
    )
    # 1000 samples in batches of 48: the last batch (40) is partial.
    history = model.fit(x, y, batch_size=48, epochs=3, callbacks=[logger], verbose=0)
    arrays = throughput_record(arrays_dir)
    dataset_dir = os.path.join(out_dir, "dataset")
    train = data.distribute((x, y), strategy=strategy, per_replica_batch_size=16)
    model = mlp(strategy)
    logger = keras_scaling.ThroughputLogger(
        log_dir=dataset_dir, update_freq=5, warmup_steps=2, baseline=None
    )
    model.fit(train, epochs=3, callbacks=[logger], verbose=0)
    dataset = throughput_record(dataset_dir)
    return {
        "trained": trained(history, 3),
        "arrays_global_batch_size": arrays["global_batch_size"],
        "arrays_samples_per_sec": arrays["samples_per_sec"],
        "dataset_global_batch_size": dataset["global_batch_size"],
        "dataset_samples_per_sec": dataset["samples_per_sec"],
    }


def replica_sync(strategy, out_dir):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(8, activation="relu")(inputs)
        hidden = keras.layers.BatchNormalization()(hidden)
        hidden = keras.layers.Dropout(0.2)(hidden)
        model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
        model.compile(optimizer="adam", loss="mse")
    x, y = regression(256)
    check = keras_scaling.ReplicaSyncCheck(every_n_steps=4, per_replica_state="warn")
    history = model.fit(x, y, batch_size=32, epochs=2, callbacks=[check], verbose=0)
    # Paths without Keras' numbering of repeated names ("dense_1"), so that
    # the roles of two models built alike compare equal.
    roles = {
        re.sub(r"_\d+(?=[/_]|$)", "", v.path): [v.role, v.is_per_replica_state]
        for v in keras_scaling.replica_sync.replica_state.tracked_variables(model, model.optimizer)
    }
    with strategy.scope():
        accumulating = keras.optimizers.SGD(gradient_accumulation_steps=2)
        accumulating.build(model.trainable_variables)
    accumulator_roles = sorted(
        {
            v.role
            for v in keras_scaling.replica_sync.replica_state.tracked_variables(model, accumulating)
        }
    )
    return {
        "trained": trained(history, 2),
        "report_ok": check.last_report.ok,
        "roles": roles,
        "accumulator_roles": accumulator_roles,
    }


def compat_fit(strategy, out_dir):
    x, y = regression(256)
    model = mlp(strategy)
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    status = compat.status()
    return {
        "trained": trained(history, 3),
        "replicas": strategy.num_replicas_in_sync,
        "needed": {fix.name: fix.needed for fix in status.fixes},
        "active": list(status.active),
        "status": str(status),
    }


def multi_worker_devices(out_dir):
    import tensorflow as tf

    from keras_scaling.devices import strategies

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(2)]
    )
    strategy = strategies._multi_worker_strategy()
    x, y = regression(256)
    model = mlp(strategy)
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    return {"trained": trained(history, 3), "replicas": strategy.num_replicas_in_sync}


if __name__ == "__main__":
    from keras_scaling.cli._worker import end_without_final_collection

    end_without_final_collection()
    with WarningCollector() as collector:
        result = multi_worker_devices(sys.argv[1])
    result["warnings"] = collector.messages
    print(json.dumps(result))
