"""Train one Keras model on Ray Train workers with keras_scaling, and resume after a failure.

    pip install 'keras-scaling[cluster]'      # ray[train], pinned
    python examples/ray/train_ray.py --storage-dir /tmp/ray_keras_scaling

Ray's `TensorflowTrainer` starts the workers and gives each a `TF_CONFIG`
naming all of them; the train loop is ordinary keras_scaling code:

- `keras_scaling.auto_strategy()` reads that `TF_CONFIG` and returns a
  `MultiWorkerMirroredStrategy`, with the fixes of `keras_scaling.compat`
  that plain Keras 3 `fit` needs under it (without them Ray's own Keras 3
  example fails: ray-project/ray#47464, keras-team/keras#20585);
- `keras_scaling.data.distribute` gives each worker its own share of the
  samples, each trained once per epoch;
- `ReplicaSyncCheck` and `ThroughputLogger` write TensorBoard files from the
  chief (worker 0) only, under `--storage-dir/logs`;
- `keras_scaling.BackupAndRestore` saves every `--save-every-n-steps` steps
  to `--storage-dir/backup`. When a worker dies, Ray's
  `FailureConfig(max_failures=1)` starts the workers again, and training
  resumes from the last save, inside the epoch, to the weights an
  uninterrupted run ends with, bit for bit (`--fail-at-step N` kills worker 1
  once, after step N, to show it).

Each worker writes what it ended with (optimizer steps, a SHA-256 of its
weights, the step it started from) to `--storage-dir/workers/worker-I.json`.
Ray runs here on this machine only: every address it and TensorFlow use is
127.0.0.1.
"""

import argparse
import hashlib
import json
import os

# Ray writes the node's address into TF_CONFIG; with this set (before Ray is
# imported) a single-machine Ray cluster uses 127.0.0.1 for it and for its
# own services instead of the machine's network address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

NUM_FEATURES = 16


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-dir", default="ray_keras_scaling")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--per-replica-batch-size", type=int, default=32)
    parser.add_argument("--save-every-n-steps", type=int, default=5)
    parser.add_argument(
        "--fail-at-step",
        type=int,
        default=None,
        help="kill worker 1 once, after this optimizer step, to show Ray's restart and the resume",
    )
    return parser.parse_args(argv)


def make_data(num_samples):
    """A noisy linear regression, the same on every worker."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_samples, NUM_FEATURES)).astype("float32")
    kernel = rng.normal(size=(NUM_FEATURES, 1)).astype("float32")
    y = x @ kernel + 0.1 * rng.normal(size=(num_samples, 1)).astype("float32")
    return x, y


def weights_sha256(model):
    """A hash of every weight's bytes: equal hashes, bitwise equal weights."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return digest.hexdigest()


def train_loop_per_worker(config):
    """Runs on every Ray Train worker, with `TF_CONFIG` set by Ray."""
    import keras
    import ray.train
    import tensorflow as tf

    import keras_scaling

    # Bitwise-equal resumes need deterministic kernels and seeded randomness.
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    strategy = keras_scaling.auto_strategy()
    info = keras_scaling.describe_strategy(strategy)
    print(info)

    train = keras_scaling.data.distribute(
        make_data(config["samples"]),
        strategy=strategy,
        per_replica_batch_size=config["per_replica_batch_size"],
        shuffle=True,
        seed=0,
    )
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((NUM_FEATURES,)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dropout(0.1),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")

    class StartPoint(keras.callbacks.Callback):
        """Notes the step training starts from, after BackupAndRestore restored."""

        step = None

        def on_train_batch_begin(self, batch, logs=None):
            if StartPoint.step is None:
                StartPoint.step = int(self.model.optimizer.iterations.numpy())

    class FailOnce(keras.callbacks.Callback):
        """Kills this worker after a given step, once: a machine lost mid-training."""

        def on_train_batch_end(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            if step == config["fail_at_step"] and not os.path.exists(config["fail_marker"]):
                with open(config["fail_marker"], "w") as file:
                    file.write(str(step))
                os._exit(1)

    storage_dir = config["storage_dir"]
    log_dir = os.path.join(storage_dir, "logs")
    callbacks = [
        # One directory every worker reads; only the chief writes it.
        keras_scaling.BackupAndRestore(
            os.path.join(storage_dir, "backup"),
            save_every_n_steps=config["save_every_n_steps"],
        ),
        StartPoint(),
        keras_scaling.ReplicaSyncCheck(every_n_steps=10, log_dir=log_dir),
        keras_scaling.ThroughputLogger(log_dir),
    ]
    if config.get("fail_at_step") is not None and info.worker_index == 1:
        callbacks.append(FailOnce())
    history = model.fit(
        train,
        epochs=config["epochs"],
        callbacks=callbacks,
        verbose=2 if info.is_chief else 0,
    )
    summary = {
        "worker_index": info.worker_index,
        "pid": os.getpid(),
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "start_step": StartPoint.step,
        "iterations": int(model.optimizer.iterations.numpy()),
        "weights_sha256": weights_sha256(model),
    }
    os.makedirs(os.path.join(storage_dir, "workers"), exist_ok=True)
    path = os.path.join(storage_dir, "workers", f"worker-{info.worker_index}.json")
    with open(path + ".partial", "w") as file:
        json.dump(summary, file)
    os.replace(path + ".partial", path)
    ray.train.report({"loss": history.history["loss"][-1], **summary})


def run(args):
    """Trains with Ray's TensorflowTrainer; returns Ray's `Result`."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    if not ray.is_initialized():
        ray.init(
            num_cpus=args.workers,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
        )
    storage_dir = os.path.abspath(args.storage_dir)
    trainer = TensorflowTrainer(
        train_loop_per_worker,
        train_loop_config={
            "storage_dir": storage_dir,
            "epochs": args.epochs,
            "samples": args.samples,
            "per_replica_batch_size": args.per_replica_batch_size,
            "save_every_n_steps": args.save_every_n_steps,
            "fail_at_step": args.fail_at_step,
            "fail_marker": os.path.join(storage_dir, "failed-once"),
        },
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
        run_config=RunConfig(
            name="keras_scaling",
            storage_path=os.path.join(storage_dir, "ray"),
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    return trainer.fit()


def main():
    args = parse_args()
    run(args)
    for index in range(args.workers):
        path = os.path.join(args.storage_dir, "workers", f"worker-{index}.json")
        with open(path) as file:
            summary = json.load(file)
        print(
            f"worker {index}: {summary['iterations']} steps (started at step "
            f"{summary['start_step']}), weights sha256 {summary['weights_sha256'][:16]}..."
        )


if __name__ == "__main__":
    main()
