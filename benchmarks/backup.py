"""Cost of `BackupAndRestore`: one save, and the fit overhead of saving every 100 steps.

Runs on a MirroredStrategy over 2 logical CPUs and prints, side by side:

1. For the `mlp` and `resnet50` presets of `keras-scaling bench` (SGD with
   momentum, so the optimizer has a slot per weight): the time of one save
   (every model and optimizer variable to NumPy, written to a temporary file,
   flushed to disk and renamed over the previous backup), against
   `model.save_weights` to a `.weights.h5` file, what
   `keras.callbacks.BackupAndRestore` writes. Alternating rounds; median and
   spread (min-max) of each, and the ratio of the medians.
2. The `fit` overhead of `BackupAndRestore(save_every_n_steps=100)` on the
   `mlp` preset fed by `keras_scaling.data.distribute`: fits with and
   without the callback in alternating rounds (ABBA), ratio of the median
   times.

Usage:
    python benchmarks/backup.py            # full run
    python benchmarks/backup.py --quick    # smoke run, small sizes
"""

import argparse
import gc
import logging
import os
import statistics
import tempfile
import time

import keras_scaling

keras_scaling.use_logical_cpus(2)

import tensorflow as tf  # noqa: E402

from keras_scaling.cli import _models  # noqa: E402
from keras_scaling.preemption import _backup  # noqa: E402

# The callback warns once that no fit is running when it is driven directly.
logging.getLogger("keras_scaling").setLevel(logging.ERROR)


def build(strategy, preset):
    with strategy.scope():
        model = _models.build_model(preset)
        _models.compile_for_bench(model, preset, steps_per_execution=1)
        model.optimizer.build(model.trainable_variables)
    return model


def spread(times_s):
    return f"median {statistics.median(times_s):.3f} s (min {min(times_s):.3f}, max {max(times_s):.3f})"


def one_save(strategy, preset, rounds):
    model = build(strategy, preset)
    with tempfile.TemporaryDirectory() as directory:
        callback = keras_scaling.BackupAndRestore(
            os.path.join(directory, "backup"), save_on_preemption=False
        )
        callback.set_model(model)
        callback.on_train_begin()
        weights_path = os.path.join(directory, "keras.weights.h5")
        ours, keras_own = [], []
        for _ in range(rounds + 1):  # the first round warms up both
            start = time.perf_counter()
            callback.on_epoch_end(0)
            ours.append(time.perf_counter() - start)
            start = time.perf_counter()
            model.save_weights(weights_path)
            keras_own.append(time.perf_counter() - start)
        size_mb = os.path.getsize(_backup.backup_path(callback.backup_dir)) / 1e6
        keras_mb = os.path.getsize(weights_path) / 1e6
        callback.on_train_end()
    ours, keras_own = ours[1:], keras_own[1:]
    print(
        f"{preset}: {model.count_params():,} parameters; backup {size_mb:.1f} MB "
        f"(model and optimizer), .weights.h5 {keras_mb:.1f} MB\n"
        f"  one BackupAndRestore save:  {spread(ours)}\n"
        f"  model.save_weights:         {spread(keras_own)}\n"
        f"  save / save_weights: {statistics.median(ours) / statistics.median(keras_own):.2f}x"
    )


def fit_time_s(strategy, with_backup, steps, directory):
    model = build(strategy, "mlp")
    x, y = _models.synthetic_data(model, steps * 64)
    train = keras_scaling.data.distribute((x, y), strategy=strategy, global_batch_size=64)
    callbacks = []
    if with_backup:
        callbacks = [
            keras_scaling.BackupAndRestore(
                os.path.join(directory, "backup"), save_every_n_steps=100
            )
        ]
    model.fit(train.take(2), verbose=0)  # traces the train function
    start = time.perf_counter()
    model.fit(train, verbose=0, callbacks=callbacks)
    return time.perf_counter() - start


def fit_overhead(strategy, steps, rounds):
    plain, backed_up = [], []
    with tempfile.TemporaryDirectory() as directory:
        for round_index in range(rounds):
            # ABBA order and a collection before each fit: neither variant
            # always runs first or after the other's leftovers.
            for with_backup in (False, True)[:: 1 if round_index % 2 == 0 else -1]:
                gc.collect()
                elapsed_s = fit_time_s(strategy, with_backup, steps, directory)
                (backed_up if with_backup else plain).append(elapsed_s)
    ratio = statistics.median(backed_up) / statistics.median(plain)
    print(
        f"fit of the mlp preset, {steps} steps of 64 samples, alternating rounds:\n"
        f"  without a backup:                    {spread(plain)}\n"
        f"  BackupAndRestore(save_every_n_steps=100): {spread(backed_up)}\n"
        f"  with / without: {ratio:.3f} ({(ratio - 1) * 100:+.1f}%)"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run with small sizes")
    args = parser.parse_args(argv)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    print(f"{keras_scaling.describe_strategy(strategy)}\n")
    rounds = 2 if args.quick else 5  # saves: cheap enough for 5 rounds
    one_save(strategy, "mlp", rounds)
    if not args.quick:
        one_save(strategy, "resnet50", rounds)
    fit_overhead(strategy, steps=200 if args.quick else 500, rounds=1 if args.quick else 4)


if __name__ == "__main__":
    main()
