"""Trains a small model with BackupAndRestore and/or ThroughputLogger, for the storage faults.

The fault tests run it inside a private mount namespace where `--backup-dir`
or `--log-dir` is a small tmpfs or a read-only mount, which vanish with the
process: so the worker itself reads back what is left (the backup, the
throughput record) and writes a JSON report to `--report`, outside them.
`--fill-after-step N` fills the file system of `--fill-dir` after optimizer
step N, leaving `--leave-bytes` free.

`ARGS --then ARGS...` trains once per group of arguments, in turn, in this
process (starting TensorFlow costs seconds of CPU time), each from the same
seed and writing its own report.
"""

import argparse
import json
import os
import sys
import time
import traceback


def parse_args(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", required=True)
    parser.add_argument("--backup-dir", default=None)
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--save-every", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--fill-dir", default=None)
    parser.add_argument("--fill-after-step", type=int, default=None)
    parser.add_argument("--leave-bytes", type=int, default=0)
    return parser.parse_args(argv)


def fill(directory, leave_bytes):
    """Writes a file until the file system is full, then frees `leave_bytes`."""
    path = os.path.join(directory, "filler")
    chunk = b"\0" * 65536
    with open(path, "wb") as file:
        try:
            while True:
                file.write(chunk)
                file.flush()
        except OSError:
            pass
    size = os.path.getsize(path)
    os.truncate(path, max(0, size - leave_bytes))


def main():
    groups = [[]]
    for arg in sys.argv[1:]:
        if arg == "--then":
            groups.append([])
        else:
            groups[-1].append(arg)
    for group in groups:
        train(parse_args(group))


def train(args):
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_scaling
    from keras_scaling.preemption import _backup
    from keras_scaling.throughput import _run_record

    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    train = keras_scaling.data.distribute((x, y), global_batch_size=8, shuffle=True, seed=1)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(args.units, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    report = {"start_iterations": None}

    class Faults(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            # After BackupAndRestore's on_train_begin, which restores.
            if report["start_iterations"] is None:
                report["start_iterations"] = int(self.model.optimizer.iterations.numpy())

        def on_train_batch_end(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            if step != args.fill_after_step:
                return
            if args.log_dir:
                # The first record (written at the first epoch's end) is there.
                record = os.path.join(args.log_dir, _run_record.THROUGHPUT_JSON)
                deadline = time.monotonic() + 60
                while not os.path.exists(record) and time.monotonic() < deadline:
                    time.sleep(0.05)
                report["record_before_fill"] = _run_record.read_throughput_json(record)
            fill(args.fill_dir, args.leave_bytes)

    try:
        callbacks = [Faults()]
        if args.backup_dir:
            callbacks.append(
                keras_scaling.BackupAndRestore(
                    args.backup_dir, save_every_n_steps=args.save_every, delete_checkpoint=False
                )
            )
        if args.log_dir:
            callbacks.append(keras_scaling.ThroughputLogger(args.log_dir, update_freq=2))
        model.fit(train, epochs=args.epochs, verbose=0, callbacks=callbacks)
        report["error"] = None
    except Exception as error:
        report["error"] = {
            "type": type(error).__name__,
            "message": str(error),
            "errno": getattr(error, "errno", None),
            "traceback": traceback.format_exc()[-3000:],
        }
    report["iterations"] = int(model.optimizer.iterations.numpy())
    if args.backup_dir:
        try:
            backup = _backup.read(args.backup_dir)
            report["backup_position"] = None if backup is None else backup[0]["position"]
        except Exception as error:
            report["backup_position"] = f"unreadable: {error}"
        report["backup_dir_files"] = sorted(os.listdir(args.backup_dir))
    if args.log_dir and os.path.exists(os.path.join(args.log_dir, _run_record.THROUGHPUT_JSON)):
        try:
            report["record_after"] = _run_record.read_throughput_json(
                os.path.join(args.log_dir, _run_record.THROUGHPUT_JSON)
            )
        except Exception as error:
            report["record_after"] = f"unreadable: {error}"
    with open(args.report, "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    from keras_scaling.cli._worker import end_without_final_collection

    end_without_final_collection()
    main()
