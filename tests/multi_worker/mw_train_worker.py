"""Worker of the fit/evaluate test: trains with the adapter and both callbacks.

Writes `worker{i}.json` (strategy, plan, ids trained on per epoch, steps per
epoch, evaluate results) and `worker{i}_weights.npz` (every local copy of
every model and optimizer variable) to `--out-dir`.
"""

import argparse
import os

import keras
import mw_common
import numpy as np

import keras_scaling
from keras_scaling import data


class _EpochSteps(keras.callbacks.Callback):
    """Counts the steps of each epoch and tells the recorder the epoch."""

    def __init__(self, recorder):
        super().__init__()
        self.recorder = recorder
        self.steps_by_epoch = {}

    def on_epoch_begin(self, epoch, logs=None):
        self.recorder.epoch = epoch
        self.steps_by_epoch[epoch] = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps_by_epoch[self.recorder.epoch] += 1


def _count_input_timing_calls():
    """Counts the advice's timings of the input pipeline (each still runs) from now on."""
    from keras_scaling.throughput import _input_timing

    calls = []
    timing = getattr(_input_timing.input_samples_per_sec, "__wrapped__", None)
    timing = timing or _input_timing.input_samples_per_sec

    def counted(*args, **kwargs):
        calls.append(1)
        return timing(*args, **kwargs)

    counted.__wrapped__ = timing
    _input_timing.input_samples_per_sec = counted
    return calls


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--per-replica-batch-size", type=int, default=4)
    parser.add_argument(
        "--baseline",
        type=float,
        default=None,
        help="ThroughputLogger's baseline samples/sec: a huge one makes the "
        "low-efficiency advice time the input pipeline",
    )
    parser.add_argument("--update-freq", type=int, default=2)
    return parser.parse_args(argv)


def main():
    args = parse_args()
    strategy = keras_scaling.auto_strategy()
    train(strategy, args)


def train(strategy, args):
    """Trains and writes what the worker saw; `args` as `parse_args` gives them."""
    timing_calls = _count_input_timing_calls()
    info = keras_scaling.describe_strategy(strategy)
    name = f"worker{info.worker_index}"
    mw_common.record_pid(args.out_dir, name)

    x, y = mw_common.make_data(args.samples)
    train = data.distribute(
        (x, y),
        strategy=strategy,
        per_replica_batch_size=args.per_replica_batch_size,
        shuffle=True,
        seed=7,
    )
    x_val, y_val = mw_common.make_data(args.samples // 2 + 3, seed=1)
    validation = data.distribute(
        (x_val, y_val),
        strategy=strategy,
        per_replica_batch_size=args.per_replica_batch_size,
        last_batch="pad",
    )
    recorder = mw_common.IdRecorder()
    with strategy.scope():
        model = mw_common.build_model(recorder)
    epoch_steps = _EpochSteps(recorder)
    model.fit(
        train,
        epochs=args.epochs,
        callbacks=[
            epoch_steps,
            keras_scaling.ReplicaSyncCheck(every_n_steps=2),
            keras_scaling.ThroughputLogger(
                args.log_dir, baseline=args.baseline, update_freq=args.update_freq
            ),
        ],
        verbose=0,
    )
    evaluation = model.evaluate(validation, return_dict=True, verbose=0)

    copies = mw_common.local_copies(strategy, model.variables + model.optimizer.variables)
    np.savez(
        os.path.join(args.out_dir, f"{name}_weights.npz"),
        **{
            f"{path}#{replica}": value
            for path, values in copies.items()
            for replica, value in enumerate(values)
        },
    )
    # The weights the model would be saved with: replica 0's copy.
    np.savez(os.path.join(args.out_dir, f"{name}_dense.npz"), *model.get_weights())
    # Written last: the test reads it as the sign that this worker finished.
    plan = data.plan_of(train)
    mw_common.write_json(
        os.path.join(args.out_dir, f"{name}.json"),
        {
            "pid": os.getpid(),
            "worker_index": info.worker_index,
            "is_chief": info.is_chief,
            "num_workers": info.num_workers,
            "num_replicas": info.num_replicas,
            "local_devices": list(info.local_devices),
            "steps_per_epoch": plan.steps_per_epoch,
            "global_batch_size": plan.global_batch_size,
            "ids_by_epoch": {str(epoch): ids for epoch, ids in recorder.ids_by_epoch.items()},
            "steps_by_epoch": {
                str(epoch): steps for epoch, steps in epoch_steps.steps_by_epoch.items()
            },
            "iterations": int(model.optimizer.iterations.numpy()),
            "input_timing_calls": len(timing_calls),
            "evaluation": {key: float(value) for key, value in evaluation.items()},
        },
    )


if __name__ == "__main__":
    from keras_scaling.cli._worker import end_without_final_collection

    end_without_final_collection()
    main()
