"""ResNet50 under `keras_scaling.auto_strategy()`: on a TPU where there is one.

`auto_strategy()` returns a `TPUStrategy` on a TPU VM (or with `TPU_NAME`
set), and otherwise falls back to what the machine has: several GPUs, or one
device. The same script therefore runs unchanged on a TPU and, slowly but
correctly, on a laptop's CPU.

What TPUs need, and this script does:
- static shapes: `keras_scaling.data.distribute(..., last_batch="drop")`
  never yields a smaller last batch (under `TPUStrategy` shapes are always
  static), so the step is compiled once;
- a global batch that fills every core: the per-replica batch times the
  replicas;
- `steps_per_execution`: several steps per compiled call, so the host does
  not wait on every step.

Run:

    python examples/tpu_fit.py                          # CPU: about a minute
    python examples/tpu_fit.py --samples 50000 --per-replica-batch 128 \\
        --steps-per-execution 32 --epochs 5             # on a TPU
"""

import argparse
import os
import shlex

import keras_scaling


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=320)
    parser.add_argument("--per-replica-batch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps-per-execution", type=int, default=4)
    parser.add_argument("--log-dir", default=os.path.join("logs", "tpu_fit"))
    return parser.parse_args()


def main():
    args = _arguments()
    import keras
    import numpy as np

    strategy = keras_scaling.auto_strategy()
    print(keras_scaling.describe_strategy(strategy))

    # CIFAR-10-shaped synthetic images: 32x32x3, 10 classes.
    rng = np.random.default_rng(0)
    x = rng.random((args.samples, 32, 32, 3), dtype="float32")
    y = rng.integers(0, 10, size=args.samples)
    dataset = keras_scaling.data.distribute(
        (x, y),
        strategy=strategy,
        per_replica_batch_size=args.per_replica_batch,
        shuffle=True,
        seed=0,
        last_batch="drop",
    )
    plan = keras_scaling.data.plan_of(dataset)
    print(plan)
    print(f"Static batch shape: {dataset.element_spec[0].shape}")
    print(
        f"steps_per_execution={args.steps_per_execution}: "
        f"{plan.steps_per_epoch} steps per epoch in "
        f"{-(-plan.steps_per_epoch // args.steps_per_execution)} compiled calls"
    )

    with strategy.scope():
        model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            steps_per_execution=args.steps_per_execution,
        )

    callbacks = [
        keras_scaling.ThroughputLogger(args.log_dir, baseline=None),
        keras.callbacks.TensorBoard(args.log_dir),
    ]
    # The dataset is shuffled already: seeded, one order shared by all workers.
    history = model.fit(dataset, epochs=args.epochs, callbacks=callbacks, shuffle=False, verbose=2)
    print(
        f"Trained {args.epochs} epoch(s) of {plan.steps_per_epoch} steps, "
        f"global batch {plan.global_batch_size}: final loss "
        f"{history.history['loss'][-1]:.4f}"
    )
    print(f"Open TensorBoard: tensorboard --logdir {shlex.quote(args.log_dir)}")


if __name__ == "__main__":
    main()
