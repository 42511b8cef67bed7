"""Multi-worker training on Slurm that survives preemption: `sbatch examples/slurm/train.sbatch`.

Every task of the job step (`srun`) runs this same script. With no
`TF_CONFIG` and no arguments, `keras_scaling.auto_strategy()` reads the
step's variables (node list, tasks per node, this task's rank) and builds a
`MultiWorkerMirroredStrategy` over all tasks; the log says where the cluster
came from ("Slurm job 1234 step 0: 4 tasks on 2 nodes").

Preemption: `train.sbatch` asks Slurm for SIGTERM before the time limit
(`--signal`) and to be requeued (`--requeue`). On SIGTERM,
`keras_scaling.BackupAndRestore` saves where training stands, on storage
every node shares, and every task exits with status 75; the batch script
requeues the job, and the requeued job resumes at that step, inside the
epoch: with deterministic ops the final weights are bitwise those of a run
that was never stopped.

Writes under `--shared-dir`: `backup/` (while training), `logs/` (TensorBoard:
replica sync and throughput, from the chief) and, at the end,
`final.weights.npz` (the chief's weights).
"""

import argparse
import os

import keras
import numpy as np
import tensorflow as tf

import keras_scaling


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared-dir", required=True, help="a directory every node of the job reads and writes"
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--per-replica-batch-size", type=int, default=16)
    return parser.parse_args()


def main():
    args = _arguments()
    # Bitwise-equal resumes need deterministic kernels and seeded randomness.
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    strategy = keras_scaling.auto_strategy()
    info = keras_scaling.describe_strategy(strategy)
    print(info, flush=True)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, 16)).astype("float32")
    y = (x @ rng.normal(size=(16, 1))).astype("float32")
    train = keras_scaling.data.distribute(
        (x, y),
        strategy=strategy,
        per_replica_batch_size=args.per_replica_batch_size,
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

    log_dir = os.path.join(args.shared_dir, "logs")
    # A preemption ends fit with SystemExit(75) on every task: the lines
    # after it do not run, and train.sbatch requeues the job.
    model.fit(
        train,
        epochs=args.epochs,
        verbose=2 if info.is_chief else 0,
        callbacks=[
            # One directory for all tasks, on shared storage: the chief
            # writes, every task reads when the requeued job starts.
            keras_scaling.BackupAndRestore(
                os.path.join(args.shared_dir, "backup"), save_every_n_steps=200
            ),
            keras_scaling.ReplicaSyncCheck(log_dir=log_dir),
            # baseline=None: samples/sec without a speedup figure. With the
            # default baseline ("auto") a resumed job's final weights were
            # measured to differ from those of a job never stopped.
            keras_scaling.ThroughputLogger(log_dir, baseline=None),
        ],
    )
    if info.is_chief:
        path = os.path.join(args.shared_dir, "final.weights.npz")
        np.savez(path, *model.get_weights())
        print(f"finished: {int(model.optimizer.iterations.numpy())} optimizer steps; {path}")


if __name__ == "__main__":
    main()
