"""Training that survives preemption: stop it at any step, run it again, it resumes.

Rented machines are often preemptible: the job gets SIGTERM and a short grace
period. With `keras_scaling.BackupAndRestore`, the job saves where it stands
at the end of the step in progress and exits with status 75; running the
same command again continues from that step, inside the epoch, with the same
seeded order of `keras_scaling.data.distribute`: with deterministic ops the
final weights are bitwise those of a run that was never stopped.

What it shows:
- `BackupAndRestore(backup_dir, save_every_n_steps=...)` beside
  `ReplicaSyncCheck` and `ThroughputLogger`, whose step axes continue;
- the exit status 75 of a preempted run, and the resume.

Run:

    python examples/preemptible_fit.py --stop-at-step 30   # SIGTERM after step 30: saves at 31, status 75
    python examples/preemptible_fit.py                     # resumes after step 31, finishes

A signal is handled when the step in progress ends: the process signals
itself after step 30, while step 31 is on its way, so the backup holds step
31 and the run again says where it resumed ("resuming from ...: epoch 1/3,
after its step 31 of 32").
    # On 2 workers, restarted after a preemption (up to 3 times):
    keras-scaling launch --workers 2 --cpu-devices 2 --max-restarts 3 -- \\
        python examples/preemptible_fit.py
"""

import argparse
import os
import signal

import keras_scaling


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-dir", default="logs/preemptible_fit")
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=2,
        help="logical CPUs to train on when there is no GPU (default 2)",
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--per-replica-batch", type=int, default=32)
    parser.add_argument(
        "--stop-at-step",
        type=int,
        default=None,
        help=(
            "send this process SIGTERM after this optimizer step, as a preemption "
            "would; the backup is saved at the end of the next step, the one in progress"
        ),
    )
    return parser.parse_args()


def main():
    args = _arguments()
    if "TF_CONFIG" not in os.environ:
        keras_scaling.use_logical_cpus(args.cpu_devices)
    import keras
    import numpy as np
    import tensorflow as tf

    # Bitwise-equal resumes need deterministic kernels and seeded randomness.
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    strategy = keras_scaling.auto_strategy()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, 16)).astype("float32")
    y = (x @ rng.normal(size=(16, 1))).astype("float32")
    train = keras_scaling.data.distribute(
        (x, y), strategy=strategy, per_replica_batch_size=args.per_replica_batch
    )
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((16,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dropout(0.1),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")

    class Preempt(keras.callbacks.Callback):
        """Stands in for the machine's owner: SIGTERM after a given step."""

        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == args.stop_at_step:
                os.kill(os.getpid(), signal.SIGTERM)

    callbacks = [
        keras_scaling.BackupAndRestore(
            os.path.join(args.log_dir, "backup"), save_every_n_steps=100
        ),
        keras_scaling.ReplicaSyncCheck(log_dir=args.log_dir),
        keras_scaling.ThroughputLogger(args.log_dir),
    ]
    if args.stop_at_step is not None:
        callbacks.insert(0, Preempt())
    # A preemption ends fit with SystemExit(75): the lines below do not run.
    model.fit(train, epochs=args.epochs, verbose=2, callbacks=callbacks)
    print(f"finished: {int(model.optimizer.iterations.numpy())} optimizer steps")


if __name__ == "__main__":
    main()
