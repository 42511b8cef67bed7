"""One worker of the multi-worker compat test: trains, then probes the defects.

Run with `TF_CONFIG` naming this worker and `KERAS_SCALING_CPU_DEVICES`:

    python tests/workers/compat_worker.py OUT_DIR

It writes `OUT_DIR/worker<i>_weight<j>.npy` (the weights after `fit`) and
`OUT_DIR/worker<i>.json` (what `fit`, `evaluate` and `predict` returned, and
the error each defect raises with its fix turned off).
"""

import json
import os
import sys

import numpy as np

import keras_scaling

NUM_SAMPLES = 96
GLOBAL_BATCH_SIZE = 16
STEPS_PER_EXECUTION = 4  # 6 batches: one execution of 4, a partial one of 2


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
    history = model.fit(
        x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=2, shuffle=False, verbose=0
    )
    report["loss"] = history.history["loss"]
    report["iterations"] = int(model.optimizer.iterations.numpy())
    report["evaluate"] = model.evaluate(
        x, y, batch_size=GLOBAL_BATCH_SIZE, verbose=0, return_dict=True
    )
    report["predict_shape"] = list(
        model.predict(x, batch_size=GLOBAL_BATCH_SIZE, verbose=0).shape
    )
    for number, weight in enumerate(model.get_weights()):
        np.save(os.path.join(out_dir, f"worker{index}_weight{number}.npy"), weight)

    # Each defect, with only its own fix off, must still break `fit`; both
    # fail while tracing or building, the same way on every worker, before
    # any collective runs.
    def fit_once():
        make_model(strategy, 1).fit(
            x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=1, verbose=0
        )

    report["defects"] = {}
    for name in ("symbolic_build", "scalar_reduce"):
        compat.enable()
        compat.disable(name)
        report["defects"][name] = error_of(fit_once)
    compat.enable()

    with open(os.path.join(out_dir, f"worker{index}.json"), "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    main(sys.argv[1])
