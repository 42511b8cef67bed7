"""Worker of the divergence test: worker 1 alone changes one replica's kernel copy.

Before `fit`, worker 1 adds 1.0 to its second local copy of the last
layer's kernel; worker 0 changes nothing. `ReplicaSyncCheck` must then stop
`fit` on both workers at the same step. Each worker writes `worker{i}.json`
with the error it caught and the step of the failed check, and exits 0: a
non-zero status would make the launcher stop the other worker, perhaps
before it has recorded its own verdict.
"""

import argparse
import os

import mw_common

import keras_scaling
from keras_scaling import data


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    diverge(keras_scaling.auto_strategy(), args.out_dir)


def diverge(strategy, out_dir):
    info = keras_scaling.describe_strategy(strategy)
    name = f"worker{info.worker_index}"
    mw_common.record_pid(out_dir, name)

    x, y = mw_common.make_data(64)
    train = data.distribute(
        (x, y), strategy=strategy, per_replica_batch_size=4, shuffle=True, seed=3
    )
    with strategy.scope():
        model = mw_common.build_model()
    kernel = model.layers[-1].kernel
    if info.worker_index == 1:
        copies = strategy.experimental_local_results(kernel.value)
        copies[1].assign(copies[1] + 1.0)

    outcome = {"pid": os.getpid(), "error": None}
    try:
        model.fit(
            train,
            epochs=2,
            callbacks=[keras_scaling.ReplicaSyncCheck(every_n_steps=2)],
            verbose=0,
        )
    except keras_scaling.ReplicaDivergenceError as error:
        report = error.report
        outcome.update(
            error=type(error).__name__,
            step=getattr(report, "step", None),
            message=str(error),
        )
        print(f"ReplicaDivergenceError at step {outcome['step']}")
    outcome["iterations"] = int(model.optimizer.iterations.numpy())
    mw_common.write_json(os.path.join(out_dir, f"{name}.json"), outcome)


if __name__ == "__main__":
    main()
