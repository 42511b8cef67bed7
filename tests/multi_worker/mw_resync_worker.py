"""Worker of the ReplicaSyncCheck test on 2 workers: the verdict on a divergence, then its repair.

Worker 1 adds 1.0 to its first local copy of the first kernel. `check()`
must name that variable on both workers, `fit` must stop both at the check
that starts training, and a `fit` with `on_divergence="resync"` must leave
every copy alike. Writes `worker{i}.json` to the output directory.
"""

import os

import mw_common
import numpy as np

import keras_scaling
from keras_scaling.replica_sync.replica_sync_check import ReplicaDivergenceError


def resync(strategy, out_dir):
    import keras
    import tensorflow as tf

    index = keras_scaling.describe_strategy(strategy).worker_index
    # The names Keras gives the first such model of a process: the test names the variable.
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(3, name="dense"),
                keras.layers.Dense(1, name="dense_1"),
            ],
            name="sequential",
        )
        model.compile(optimizer="sgd", loss="mse")
    check = keras_scaling.ReplicaSyncCheck(every_n_steps=2)
    check.set_model(model)
    healthy = check.check()
    if index == 1:
        copy = strategy.experimental_local_results(model.layers[1].kernel.value)[0]
        copy.assign(copy + 1.0)
    diverged = check.check()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8).repeat()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    outcome = {
        "healthy": [v.path for v in healthy.divergences],
        "diverged": [v.path for v in diverged.divergences],
        "replicas": list(diverged.divergences[0].difference.differing_replicas),
        "devices": list(diverged.divergences[0].devices),
        "num_workers": diverged.num_workers,
        "num_replicas": diverged.num_replicas,
    }
    try:
        model.fit(dataset.with_options(options), steps_per_epoch=6, callbacks=[check], verbose=0)
    except ReplicaDivergenceError as error:
        outcome["raised_at_step"] = error.report.step
    repair = keras_scaling.ReplicaSyncCheck(every_n_steps=2, on_divergence="resync")
    model.fit(dataset.with_options(options), steps_per_epoch=4, callbacks=[repair], verbose=0)
    after = repair.check()
    outcome["after_resync"] = [v.path for v in after.variables]
    outcome["steps_after_resync"] = after.step
    mw_common.write_json(os.path.join(out_dir, f"worker{index}.json"), outcome)
