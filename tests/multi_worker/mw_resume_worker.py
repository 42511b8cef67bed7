"""Worker of the fault test: training with `BackupAndRestore`, optionally killed.

With `--kill-at-epoch K`, worker 1 kills itself with SIGKILL in the middle of
epoch K (after its second step), when both workers have saved their backup
of epoch K - 1 and worker 0 is blocked in a collective waiting for it.
Writes `run{R}_worker{i}.json` (the epoch and optimizer step training
started from, and the step it ended at) to `--out-dir` when it finishes.
"""

import argparse
import os
import signal
import time

import keras
import mw_common

import keras_scaling
from keras_scaling import data


class _KillSelf(keras.callbacks.Callback):
    """SIGKILL this process after step `after_batch` of epoch `epoch`."""

    def __init__(self, epoch, after_batch, out_dir):
        super().__init__()
        self.kill_epoch = epoch
        self.after_batch = after_batch
        self.out_dir = out_dir
        self.epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == self.kill_epoch and batch == self.after_batch:
            mw_common.write_json(
                os.path.join(self.out_dir, "killed.json"),
                {
                    "time": time.time(),
                    "iterations": int(self.model.optimizer.iterations.numpy()),
                },
            )
            os.kill(os.getpid(), signal.SIGKILL)


class _StartPoint(keras.callbacks.Callback):
    """Records where training starts: after BackupAndRestore has restored."""

    def __init__(self):
        super().__init__()
        self.first_epoch = None
        self.iterations_at_start = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.first_epoch is None:
            self.first_epoch = epoch
            self.iterations_at_start = int(self.model.optimizer.iterations.numpy())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--backup-dir", required=True)
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--kill-at-epoch", type=int, default=None)
    args = parser.parse_args()

    strategy = keras_scaling.auto_strategy()
    info = keras_scaling.describe_strategy(strategy)
    name = f"run{args.run}_worker{info.worker_index}"
    mw_common.record_pid(args.out_dir, name)

    x, y = mw_common.make_data(64)
    train = data.distribute(
        (x, y), strategy=strategy, per_replica_batch_size=4, shuffle=True, seed=5
    )
    steps_per_epoch = data.plan_of(train).steps_per_epoch
    with strategy.scope():
        model = mw_common.build_model()
    start = _StartPoint()
    callbacks = [
        # One backup directory per worker: Keras writes one file, which
        # workers sharing a directory would write at the same time.
        keras.callbacks.BackupAndRestore(
            os.path.join(args.backup_dir, f"worker-{info.worker_index}")
        ),
        start,
        keras_scaling.ThroughputLogger(args.log_dir, baseline=None, update_freq=steps_per_epoch),
    ]
    if args.kill_at_epoch is not None and info.worker_index == 1:
        callbacks.append(_KillSelf(args.kill_at_epoch, 1, args.out_dir))
    model.fit(train, epochs=args.epochs, callbacks=callbacks, verbose=0)
    mw_common.write_json(
        os.path.join(args.out_dir, f"{name}.json"),
        {
            "pid": os.getpid(),
            "steps_per_epoch": steps_per_epoch,
            "first_epoch": start.first_epoch,
            "iterations_at_start": start.iterations_at_start,
            "iterations_at_end": int(model.optimizer.iterations.numpy()),
        },
    )


if __name__ == "__main__":
    from keras_scaling.cli._worker import end_without_final_collection

    end_without_final_collection()
    main()
