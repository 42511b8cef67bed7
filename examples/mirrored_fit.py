"""Data-parallel training on the devices of one machine, with keras_scaling.

One model is copied to every device (`MirroredStrategy`); each replica takes
a slice of the global batch and the updates are combined, so the copies stay
equal. Without GPUs the CPU is split into logical devices, so this runs as is
on a laptop; on a machine with two or more GPUs it uses them all.

What it shows:
- `keras_scaling.auto_strategy()` and the strategy's description;
- `keras_scaling.data.distribute`: the global batch from the per-replica
  batch, seeded shuffling, static shapes, and its printed input plan;
- `ReplicaSyncCheck` (the mirrored copies stay equal) and `ThroughputLogger`
  (samples/sec, speedup and efficiency) beside `keras.callbacks.TensorBoard`.

Run:

    python examples/mirrored_fit.py                    # 2 logical CPUs, ~30 s
    python examples/mirrored_fit.py --cpu-devices 4 --epochs 5
    tensorboard --logdir logs/mirrored_fit
"""

import argparse
import json
import os
import shlex

import keras_scaling


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=2,
        help="logical CPUs to train on when there is no GPU (default 2)",
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--per-replica-batch", type=int, default=64)
    parser.add_argument("--log-dir", default=os.path.join("logs", "mirrored_fit"))
    return parser.parse_args()


def _make_data(num_samples, seed=0):
    """A learnable problem: the class is the sign pattern of two projections."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_samples, 32)).astype("float32")
    projections = x @ rng.normal(size=(32, 2)).astype("float32")
    y = (projections[:, 0] > 0).astype("int64") * 2 + (projections[:, 1] > 0)
    return x, y


def main():
    args = _arguments()
    import tensorflow as tf

    # Logical CPUs must be made before TensorFlow uses any device.
    if not tf.config.list_physical_devices("GPU"):
        keras_scaling.use_logical_cpus(args.cpu_devices)
    import keras

    strategy = keras_scaling.auto_strategy()
    print(keras_scaling.describe_strategy(strategy))

    x, y = _make_data(args.samples)
    dataset = keras_scaling.data.distribute(
        (x, y),
        strategy=strategy,
        per_replica_batch_size=args.per_replica_batch,
        shuffle=True,
        seed=0,
    )
    print(keras_scaling.data.plan_of(dataset))

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(4),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )

    callbacks = [
        keras_scaling.ReplicaSyncCheck(every_n_steps=50, log_dir=args.log_dir),
        keras_scaling.ThroughputLogger(args.log_dir),
        keras.callbacks.TensorBoard(args.log_dir),
    ]
    # The dataset is shuffled already: seeded, one order shared by all workers.
    history = model.fit(dataset, epochs=args.epochs, callbacks=callbacks, shuffle=False, verbose=2)

    with open(os.path.join(args.log_dir, "throughput.json"), encoding="utf-8") as file:
        throughput = json.load(file)
    print(
        f"Trained {args.epochs} epochs on {throughput['num_replicas']} replicas: "
        f"final loss {history.history['loss'][-1]:.4f}, accuracy "
        f"{history.history['accuracy'][-1]:.3f}, "
        f"{throughput['samples_per_sec']:.0f} samples/sec"
        + (
            f", speedup {throughput['speedup']:.2f}x over one replica"
            if throughput.get("speedup")
            else ""
        )
    )
    print(f"Open TensorBoard: tensorboard --logdir {shlex.quote(args.log_dir)}")


if __name__ == "__main__":
    main()
