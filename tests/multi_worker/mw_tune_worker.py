"""Worker of the tune test on 2 workers: one search on both, then each packing it tried, trained.

`keras_scaling.tune` runs alike on both workers, with a model whose steps
sleep (`tests/tune/sleeping_models.py`). Then, for one pack of all the
gradients and for each `bytes_per_pack` the search tried, a fresh model
trains with `ReplicaSyncCheck` under the all-reduce options tune sets, and
the worker records how many packs TensorFlow's all-reduce made of the
gradients (its INFO log at tracing). Writes `worker{i}.json`.
"""

import os
import sys

import mw_common
import numpy as np

import keras_scaling

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tune")
)
import sleeping_models  # noqa: E402
from traced_packs import traced_packs  # noqa: E402

# Beside make test's other sessions, one candidate of this search took 56 s
# and the start 16 s (38 and 11 s on a less loaded day): 90 s holds both.
BUDGET_S = 90
PER_REPLICA_BATCH = 16


def _model(strategy, sleep):
    import keras

    with strategy.scope():
        layers = [keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)]
        if sleep:
            layers.insert(1, sleeping_models.sleep_layer())
        model = keras.Sequential(layers)
        model.compile(optimizer="sgd", loss="mse")
    return model


def tune(strategy, out_dir):
    from keras_scaling.tune import _measure

    index = keras_scaling.describe_strategy(strategy).worker_index
    rng = np.random.default_rng(0)
    x = rng.random((PER_REPLICA_BATCH * strategy.num_replicas_in_sync * 8, 8), dtype="float32")
    data = (x, x.sum(axis=1, keepdims=True))
    result = keras_scaling.tune(
        _model(strategy, sleep=True),
        data,
        per_replica_batch_size=PER_REPLICA_BATCH,
        data_kwargs={"shuffle": False},
        budget_s=BUDGET_S,
        log_dir=os.path.join(out_dir, "logs"),
        verbose=False,
    )
    tried = sorted(
        {trial["value"] for trial in result.record["trials"] if trial["knob"] == "bytes_per_pack"}
        - {None}
    )
    model = _model(strategy, sleep=False)
    runner = _measure.Runner(model, strategy, data)
    packings = []
    for bytes_per_pack in [0, *tried]:
        runner.apply_strategy_settings({"bytes_per_pack": bytes_per_pack})
        fresh = _model(strategy, sleep=False)
        with traced_packs(len(fresh.trainable_variables)) as packs:
            train = keras_scaling.data.distribute(
                data, strategy=strategy, per_replica_batch_size=PER_REPLICA_BATCH
            )
            # Raises ReplicaDivergenceError when a copy of a weight differs.
            fresh.fit(
                train,
                epochs=1,
                verbose=0,
                callbacks=[keras_scaling.ReplicaSyncCheck(every_n_steps=2)],
            )
        sizes = runner.gradient_sizes()
        packings.append({"bytes_per_pack": bytes_per_pack, "packs": packs, "sizes": sizes})
    runner.restore()
    mw_common.write_json(
        os.path.join(out_dir, f"worker{index}.json"),
        {"record": result.record, "path": result.path, "packings": packings},
    )
