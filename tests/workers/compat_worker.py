"""One worker of the multi-worker compat test: trains, then probes the defects.

Run with `TF_CONFIG` naming this worker and `KERAS_SCALING_CPU_DEVICES`:

    python tests/workers/compat_worker.py OUT_DIR

It writes `OUT_DIR/worker<i>_weight<j>.npy` (the weights after `fit`) and
`OUT_DIR/worker<i>.json` (what `fit`, `evaluate` and `predict` returned, on
arrays and on `keras_scaling.data.distribute` datasets, with bool, int and
string inputs, and what each defect does with its fix turned off).
"""

import json
import os
import sys

import numpy as np

import keras_scaling

NUM_SAMPLES = 96
GLOBAL_BATCH_SIZE = 16
STEPS_PER_EXECUTION = 4  # 6 batches: one execution of 4, a partial one of 2
# Samples of the `keras_scaling.data.distribute` runs: shares of 25 and 25,
# padded to whole global batches of 8 (1 CPU per worker) or 16 (2 CPUs).
NUM_IDS = 50
PER_REPLICA_BATCH_SIZE = 4
# Does not divide the 8 (or 4) steps of an epoch: the last execution is partial.
SHARES_STEPS_PER_EXECUTION = 3


def make_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_SAMPLES, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    return x, y


def make_model(strategy, steps_per_execution):
    import keras

    keras.utils.set_random_seed(7)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((5,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.05),
            loss="mse",
            metrics=["mae"],
            steps_per_execution=steps_per_execution,
        )
    return model


def make_identity_model(strategy):
    """y = x, whose loss is 0, so the weights never change; counts the samples.

    `weighted_metrics` count the rows with their `sample_weight` (the padding
    rows of `last_batch="pad"` weigh 0) and sum their ids: each sample counted
    exactly once gives `NUM_IDS` and `sum(range(NUM_IDS))`.
    """
    import keras

    class WeightedCount(keras.metrics.Metric):
        def __init__(self, name="weighted_count"):
            super().__init__(name=name)
            self.total = self.add_variable(shape=(), initializer="zeros", name="total")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.total.assign_add(keras.ops.sum(sample_weight))

        def result(self):
            return keras.ops.cast(self.total, self.dtype)

    class WeightedIdSum(WeightedCount):
        def __init__(self):
            super().__init__(name="weighted_id_sum")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.total.assign_add(keras.ops.sum(y_true[:, 0] * sample_weight))

    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((1,)), keras.layers.Dense(1, kernel_initializer="ones")]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss="mse",
            weighted_metrics=[WeightedCount(), WeightedIdSum()],
            steps_per_execution=SHARES_STEPS_PER_EXECUTION,
        )
    return model


def steps_per_epoch_recorder():
    """A callback: `steps` lists the optimizer steps of each epoch, and
    `announced_steps` the steps per epoch Keras told the callbacks."""
    import keras

    class StepsPerEpoch(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps = []
            self.announced_steps = None
            self._iterations_at_begin = 0

        def on_train_begin(self, logs=None):
            self.announced_steps = self.params["steps"]

        def on_epoch_begin(self, epoch, logs=None):
            self._iterations_at_begin = int(self.model.optimizer.iterations.numpy())

        def on_epoch_end(self, epoch, logs=None):
            iterations = int(self.model.optimizer.iterations.numpy())
            self.steps.append(iterations - self._iterations_at_begin)

    return StepsPerEpoch()


def run_on_worker_shares(strategy):
    """fit, evaluate and predict on datasets of `keras_scaling.data.distribute`."""
    from keras_scaling import data

    ids = np.arange(NUM_IDS, dtype="float32").reshape(-1, 1)
    train = data.distribute(
        (ids, ids),
        strategy=strategy,
        per_replica_batch_size=PER_REPLICA_BATCH_SIZE,
        last_batch="pad",
    )
    plan = data.plan_of(train)
    report = {
        "planned_steps": plan.steps_per_epoch,
        "batches": int(train.cardinality()),
        "global_batch_size": plan.global_batch_size,
        "samples_padded": plan.samples_padded_per_epoch,
    }

    validation = data.distribute(
        (ids, ids),
        strategy=strategy,
        shuffle=False,
        per_replica_batch_size=PER_REPLICA_BATCH_SIZE,
        last_batch="pad",
    )
    model = make_identity_model(strategy)
    steps = steps_per_epoch_recorder()
    history = model.fit(train, validation_data=validation, epochs=2, verbose=0, callbacks=[steps])
    report["fit_steps_per_epoch"] = steps.steps
    report["fit_announced_steps"] = steps.announced_steps
    report["fit_history"] = history.history
    report["evaluate"] = model.evaluate(validation, verbose=0, return_dict=True)

    # A dataset split between workers by hand, as users do, is counted the same.
    import tensorflow as tf

    from keras_scaling import devices

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    own_shards = (
        tf.data.Dataset.from_tensor_slices((ids, ids, np.ones(NUM_IDS, "float32")))
        .shard(devices.num_workers(strategy), devices.worker_index(strategy))
        .batch(plan.global_batch_size, drop_remainder=True)
        .with_options(options)
    )
    report["evaluate_own_shards"] = model.evaluate(own_shards, verbose=0, return_dict=True)

    inputs = data.distribute(
        ids,
        strategy=strategy,
        shuffle=False,
        per_replica_batch_size=PER_REPLICA_BATCH_SIZE,
        last_batch="pad",
    )
    report["predict"] = model.predict(inputs, verbose=0)[:, 0].round().tolist()
    return model, train, report


def run_on_bool_int_and_string_inputs(strategy, out_dir, index):
    """fit on one batch of inputs of three dtypes: a bool mask, int ids, raw text.

    Keras averages the first batch over the replicas to build the model,
    which fails on bool and string tensors without the symbolic_build fix.
    """
    import keras

    from keras_scaling import data

    rng = np.random.default_rng(5)
    words = rng.choice(["red", "green", "blue", "black"], size=(NUM_IDS, 3))
    inputs = {
        "mask": rng.random((NUM_IDS, 3)) > 0.5,
        "ids": rng.integers(0, 10, size=(NUM_IDS, 3)).astype("int32"),
        "text": np.array([" ".join(row) for row in words]),
    }
    y = (words == "red").sum(axis=1, keepdims=True).astype("float32")
    train = data.distribute(
        (inputs, y), strategy=strategy, per_replica_batch_size=PER_REPLICA_BATCH_SIZE
    )
    keras.utils.set_random_seed(11)
    with strategy.scope():
        vectorize = keras.layers.TextVectorization(max_tokens=6, output_sequence_length=3)
        vectorize.adapt(inputs["text"])
        mask = keras.Input((3,), dtype="bool", name="mask")
        ids = keras.Input((3,), dtype="int32", name="ids")
        text = keras.Input((), dtype="string", name="text")
        words_and_ids = keras.layers.Concatenate()(
            [keras.layers.Embedding(6, 2)(vectorize(text)), keras.layers.Embedding(10, 2)(ids)]
        )
        features = keras.layers.Concatenate()(
            [
                keras.layers.Flatten()(words_and_ids),
                keras.layers.Lambda(lambda m: keras.ops.cast(m, "float32"))(mask),
            ]
        )
        model = keras.Model([mask, ids, text], keras.layers.Dense(1)(features))
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(train, epochs=2, verbose=0)
    for number, weight in enumerate(model.get_weights()):
        np.save(os.path.join(out_dir, f"worker{index}_dtypes_weight{number}.npy"), weight)
    return {
        "loss": history.history["loss"],
        "iterations": int(model.optimizer.iterations.numpy()),
        "planned_steps": data.plan_of(train).steps_per_epoch,
    }


def error_of(run):
    """Runs `run()`; returns the error it raised as text, or None."""
    try:
        run()
    except Exception as error:  # the defects raise several error types
        return f"{type(error).__name__}: {error}"[:2000]
    return None


def main(out_dir):
    from keras_scaling import compat, devices

    strategy = keras_scaling.auto_strategy()
    index = devices.worker_index(strategy)
    x, y = make_data()
    report = {
        "strategy": devices.strategy_kind(strategy),
        "num_replicas": strategy.num_replicas_in_sync,
        "active_fixes": list(compat.status().active),
    }

    model = make_model(strategy, STEPS_PER_EXECUTION)
    history = model.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=2, shuffle=False, verbose=0)
    report["loss"] = history.history["loss"]
    report["iterations"] = int(model.optimizer.iterations.numpy())
    report["evaluate"] = model.evaluate(
        x, y, batch_size=GLOBAL_BATCH_SIZE, verbose=0, return_dict=True
    )
    report["predict_shape"] = list(model.predict(x, batch_size=GLOBAL_BATCH_SIZE, verbose=0).shape)
    for number, weight in enumerate(model.get_weights()):
        np.save(os.path.join(out_dir, f"worker{index}_weight{number}.npy"), weight)

    # Each defect, with only its own fix off, must still break `fit`; both
    # fail while tracing or building, the same way on every worker, before
    # any collective runs.
    def fit_once():
        make_model(strategy, 1).fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=1, verbose=0)

    report["defects"] = {}
    for name in ("symbolic_build", "scalar_reduce"):
        compat.enable()
        compat.disable(name)
        report["defects"][name] = error_of(fit_once)
    compat.enable()

    model, train, report["worker_shares"] = run_on_worker_shares(strategy)
    # Without the fix every worker stops early, at the same step: no hang.
    # The fix acts when `fit` makes its iterator, so the model can be reused.
    compat.disable("multi_worker_epoch")
    steps = steps_per_epoch_recorder()
    model.fit(train, epochs=1, verbose=0, callbacks=[steps])
    report["defects"]["multi_worker_epoch"] = steps.steps
    compat.enable()

    report["input_dtypes"] = run_on_bool_int_and_string_inputs(strategy, out_dir, index)

    with open(os.path.join(out_dir, f"worker{index}.json"), "w") as file:
        json.dump(report, file)
    # Skips TensorFlow's shutdown, a second or so of CPU time: all is written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
