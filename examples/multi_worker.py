"""Train one model on several workers, started by `keras-scaling launch`.

    keras-scaling launch --workers 2 --cpu-devices 2 -- \
        python examples/multi_worker.py --log-dir logs/multi_worker

Every worker runs this same script. `keras-scaling launch` gives each one a
`TF_CONFIG` naming all of them, so `auto_strategy()` returns a
`MultiWorkerMirroredStrategy` (here 2 workers x 2 logical CPUs = 4
replicas). Then:

- `keras_scaling.data.distribute` gives each worker its own share of the
  samples, each read once per epoch, with the same number of steps on every
  worker;
- `ReplicaSyncCheck` checks that every replica on every worker holds the same
  weights, and stops all workers together if one differs;
- `ThroughputLogger` writes the cluster's throughput to `--log-dir`, from the
  chief (worker 0) only;
- with `--backup-dir`, `keras_scaling.BackupAndRestore` saves when a worker
  is preempted (SIGTERM) and lets a relaunched run resume from that step
  (`keras-scaling launch --max-restarts N` relaunches by itself).

Open the logs with `tensorboard --logdir logs/multi_worker`.
"""

import argparse

import keras
import numpy as np

import keras_scaling
from keras_scaling import data


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-dir", default="logs/multi_worker")
    parser.add_argument("--backup-dir", default=None)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--per-replica-batch-size", type=int, default=32)
    return parser.parse_args()


TRUE_KERNEL = np.random.default_rng(42).normal(size=(16, 1)).astype("float32")


def make_data(num_samples, seed):
    """A noisy linear regression: 16 features, one target."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_samples, 16)).astype("float32")
    y = x @ TRUE_KERNEL + 0.1 * rng.normal(size=(num_samples, 1)).astype("float32")
    return x, y


def main():
    args = parse_args()
    strategy = keras_scaling.auto_strategy()
    info = keras_scaling.describe_strategy(strategy)
    print(info)

    train = data.distribute(
        make_data(args.samples, seed=0),
        strategy=strategy,
        per_replica_batch_size=args.per_replica_batch_size,
        shuffle=True,
        seed=0,
    )
    validation = data.distribute(
        make_data(args.samples // 4, seed=1),
        strategy=strategy,
        per_replica_batch_size=args.per_replica_batch_size,
        last_batch="pad",  # every validation sample counted exactly once
    )
    if info.is_chief:
        print(data.plan_of(train))

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((16,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        # weighted_metrics: the padded rows of the last batch have weight 0.
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", weighted_metrics=["mae"])

    callbacks = [
        keras_scaling.ReplicaSyncCheck(every_n_steps=20),
        keras_scaling.ThroughputLogger(args.log_dir),
    ]
    if args.backup_dir:
        # One directory for all workers: the chief writes, every worker reads.
        callbacks.insert(0, keras_scaling.BackupAndRestore(args.backup_dir))
    model.fit(
        train,
        epochs=args.epochs,
        callbacks=callbacks,
        verbose=2 if info.is_chief else 0,
    )
    results = model.evaluate(validation, return_dict=True, verbose=0)
    if info.is_chief:
        print(f"validation mae: {results['mae']:.4f}")


if __name__ == "__main__":
    main()
