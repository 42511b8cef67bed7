"""Trains a small model with `BackupAndRestore`, for the resume tests.

Run alone it trains on `--cpus` logical CPUs; under `keras-scaling launch` it
is one worker of a `MultiWorkerMirroredStrategy` job. `--sigterm-at N` makes
worker `--sigterm-worker` send itself SIGTERM after optimizer step N (a real
signal, at a step the test chooses). At the end it writes every model and
optimizer variable to `--out` (from worker 0), with the step count.

`ARGS --then ARGS...` runs one training after the other in this process, on
one strategy, each from the same seed, saying on stderr where each begins
(`RUN_MARK` and its number): starting TensorFlow costs seconds of CPU time.
A run that SIGTERM stops ends the process (status 75), so it comes last,
unless it has `--preempted-continues`: then the `SystemExit` that `fit`
raises is caught, its status said on stderr (`STOP_MARK` and the status),
and the next run goes on in this process.
"""

import argparse
import json
import os
import signal
import sys
import time

import numpy as np

RUN_MARK = "backup_worker: run "
STOP_MARK = "backup_worker: stopped with status "


def parse_args(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--backup-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=640)
    parser.add_argument("--per-replica-batch", type=int, default=8)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--save-every", type=int, default=None)
    parser.add_argument("--sigterm-at", type=int, default=None)
    parser.add_argument("--sigterm-worker", type=int, default=0)
    parser.add_argument(
        "--preempted-continues",
        action="store_true",
        help="when the preemption stops this run, go on with the next run in this process",
    )
    parser.add_argument("--data", choices=("distribute", "arrays"), default="distribute")
    parser.add_argument("--units", type=int, default=16)
    parser.add_argument("--log-dir", default=None)
    parser.add_argument(
        "--baseline",
        type=float,
        default=None,
        help="ThroughputLogger's baseline samples/sec (with --log-dir): a huge "
        "one makes the low-efficiency advice time the input pipeline",
    )
    parser.add_argument("--pid-dir", default=None)
    parser.add_argument(
        "--mark-dir",
        default=None,
        help="write `step5-{worker}` there after optimizer step 5, then sleep "
        "--sleep-per-step seconds after every step",
    )
    parser.add_argument("--sleep-per-step", type=float, default=0.0)
    parser.add_argument(
        "--chief-peeks",
        action="store_true",
        help="the chief reads a batch of the training data before fit, the others do not",
    )
    return parser.parse_args(argv)


def main():
    groups = [[]]
    for arg in sys.argv[1:]:
        if arg == "--then":
            groups.append([])
        else:
            groups[-1].append(arg)
    runs = [parse_args(group) for group in groups]
    if runs[0].pid_dir:
        os.makedirs(runs[0].pid_dir, exist_ok=True)
        with open(os.path.join(runs[0].pid_dir, f"{os.getpid()}.pid"), "w") as file:
            file.write(str(os.getpid()))
    import keras_scaling
    from keras_scaling.throughput import _input_timing

    timing_calls = []
    timing = _input_timing.input_samples_per_sec

    def counted_timing(*args, **kwargs):
        timing_calls.append(1)
        return timing(*args, **kwargs)

    _input_timing.input_samples_per_sec = counted_timing

    if "TF_CONFIG" not in os.environ:
        keras_scaling.use_logical_cpus(runs[0].cpus)
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()
    strategy = keras_scaling.auto_strategy()
    for number, args in enumerate(runs):
        print(f"{RUN_MARK}{number}", file=sys.stderr, flush=True)
        timing_calls.clear()
        try:
            train(args, strategy, timing_calls)
        except SystemExit as stop:
            if not args.preempted_continues:
                raise
            print(f"{STOP_MARK}{stop.code}", file=sys.stderr, flush=True)


def train(args, strategy, timing_calls):
    import keras

    import keras_scaling

    keras.utils.set_random_seed(0)
    index = keras_scaling.devices.worker_index(strategy)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, 8)).astype("float32")
    y = (x @ np.arange(1, 9, dtype="float32")[:, None] / 8).astype("float32")
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(args.units, activation="relu"),
                keras.layers.Dropout(0.25),
                keras.layers.Dense(1),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss="mse",
            steps_per_execution=args.steps_per_execution,
        )

    class SigtermAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            if (
                args.sigterm_at is not None
                and step == args.sigterm_at
                and index == args.sigterm_worker
            ):
                os.kill(os.getpid(), signal.SIGTERM)
            if args.mark_dir and step == 5:
                open(os.path.join(args.mark_dir, f"step5-{index}"), "w").close()
            time.sleep(args.sleep_per_step)

    class StartStep(keras.callbacks.Callback):
        """Records the optimizer step training starts from (after a restore)."""

        step = None

        def on_train_begin(self, logs=None):
            StartStep.step = int(self.model.optimizer.iterations.numpy())

    callbacks = [
        SigtermAt(),
        keras_scaling.BackupAndRestore(args.backup_dir, save_every_n_steps=args.save_every),
        StartStep(),
    ]
    if args.log_dir:
        callbacks += [
            keras_scaling.ReplicaSyncCheck(log_dir=args.log_dir, every_n_steps=5),
            keras_scaling.ThroughputLogger(args.log_dir, update_freq=2, baseline=args.baseline),
        ]
    if args.data == "distribute":
        train = keras_scaling.data.distribute(
            (x, y), strategy=strategy, per_replica_batch_size=args.per_replica_batch
        )
        if args.chief_peeks and index == 0:
            next(iter(train))
        model.fit(train, epochs=args.epochs, verbose=0, callbacks=callbacks)
    else:
        batch = args.per_replica_batch * strategy.num_replicas_in_sync
        model.fit(x, y, batch_size=batch, epochs=args.epochs, verbose=0, callbacks=callbacks)

    if index == 0:
        values = [np.asarray(v.numpy()) for v in model.variables + model.optimizer.variables]
        np.savez(args.out, *values)
        with open(args.out + ".json", "w") as file:
            json.dump(
                {
                    "iterations": int(model.optimizer.iterations.numpy()),
                    "start_iterations": StartStep.step,
                    "input_timing_calls": len(timing_calls),
                },
                file,
            )


if __name__ == "__main__":
    from keras_scaling.cli._worker import end_without_final_collection

    end_without_final_collection()
    main()
