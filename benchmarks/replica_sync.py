"""Cost of `ReplicaSyncCheck`: one check against a naive host comparison, and fit overhead.

Runs on a MirroredStrategy over 2 logical CPUs and prints, side by side:

1. For a ~1M-parameter MLP and for ResNet50 (weights=None, 32x32x3 inputs,
   10 classes, ~23.5M parameters), with Adam (so the optimizer's slots are
   compared too): the time of one check (fingerprints on the devices, a
   small table to the host) against the naive way (every replica's copy of
   every variable to NumPy, compared bitwise with replica 0's), as a ratio.
   The first check, which traces and compiles the fingerprint function, is
   reported separately.
2. The overhead of the default frequency (`every_n_steps=100`) on a `fit`
   run: the same training with and without the callback (A/B, which load
   on the machine makes noisy), and the time spent inside the callback's
   own hooks relative to the rest of the same run (robust to load).

Goals: the check at least 10 times cheaper than the naive way on ResNet50;
under 2% fit overhead at the default frequency.

Usage:
    python benchmarks/replica_sync.py            # full run
    python benchmarks/replica_sync.py --quick    # smoke run, small sizes
"""

import argparse
import statistics
import time

import keras_scaling

keras_scaling.use_logical_cpus(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_scaling import replica_state  # noqa: E402
from keras_scaling.callbacks.replica_sync import ReplicaSyncCheck  # noqa: E402


def mlp_1m():
    """An MLP with 1,059,850 parameters."""
    return keras.Sequential(
        [
            keras.Input((512,)),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def resnet50():
    return keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)


def build(strategy, make_model):
    with strategy.scope():
        model = make_model()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.optimizer.build(model.trainable_variables)
    return model


def naive_check(strategy, variables):
    """Every replica's copy to NumPy, compared bitwise with replica 0's."""
    differing = []
    for variable in variables:
        copies = [c.numpy() for c in strategy.experimental_local_results(variable.variable)]
        reference = copies[0].view(f"u{copies[0].dtype.itemsize}")
        if any(
            not np.array_equal(copy.view(f"u{copy.dtype.itemsize}"), reference)
            for copy in copies[1:]
        ):
            differing.append(variable.path)
    return differing


def median_time_s(function, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare_check_costs(strategy, name, make_model, repeats):
    model = build(strategy, make_model)
    variables = replica_state.tracked_variables(model, model.optimizer)
    num_elements = sum(int(np.prod(v.shape)) for v in variables)
    checker = replica_state.ReplicaStateChecker(strategy, variables)
    start = time.perf_counter()
    report = checker.check(step=0)
    first_check_s = time.perf_counter() - start
    assert report.ok and not report.variables, report
    check_s = median_time_s(lambda: checker.check(step=0), repeats)
    naive_check(strategy, variables)
    naive_s = median_time_s(lambda: naive_check(strategy, variables), repeats)
    print(
        f"{name}: {model.count_params():,} parameters, {len(variables)} variables, "
        f"{num_elements:,} elements per replica (with Adam slots)\n"
        f"  first check (traces the function): {first_check_s:.2f} s\n"
        f"  one check: {check_s * 1e3:.1f} ms   naive host comparison: "
        f"{naive_s * 1e3:.1f} ms   naive / check: {naive_s / check_s:.1f}x"
    )
    return naive_s / check_s


class TimedReplicaSyncCheck(ReplicaSyncCheck):
    """ReplicaSyncCheck that adds up the time spent in its own hooks."""

    hook_time_s = 0.0

    def _timed(self, hook, *args):
        start = time.perf_counter()
        try:
            return hook(*args)
        finally:
            self.hook_time_s += time.perf_counter() - start

    def on_train_begin(self, logs=None):
        self._timed(super().on_train_begin, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._timed(super().on_train_batch_end, batch, logs)

    def on_train_end(self, logs=None):
        self._timed(super().on_train_end, logs)


def fit_time_s(strategy, with_check, steps, batch_size):
    """(fit time, time spent in the check's hooks) of one fit of `steps` steps."""
    model = build(strategy, mlp_1m)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch_size, 512)).astype("float32")
    y = rng.integers(0, 10, size=(steps * batch_size,))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).cache()
    check = TimedReplicaSyncCheck()
    callbacks = [check] if with_check else []
    # Traces the train function, and the check's fingerprint function once:
    # a one-time cost per callback, reported as "first check" above.
    model.fit(dataset.take(2), verbose=0, callbacks=callbacks)
    check.hook_time_s = 0.0
    start = time.perf_counter()
    model.fit(dataset, verbose=0, callbacks=callbacks)
    return time.perf_counter() - start, check.hook_time_s


def fit_overhead(strategy, steps, batch_size, repeats):
    # Interleave the runs so that load changes on the machine hit both alike.
    plain, checked, in_hooks = [], [], []
    for _ in range(repeats):
        plain.append(fit_time_s(strategy, False, steps, batch_size)[0])
        fit_s, hook_s = fit_time_s(strategy, True, steps, batch_size)
        checked.append(fit_s)
        in_hooks.append(hook_s / (fit_s - hook_s))
    plain_s, checked_s = statistics.median(plain), statistics.median(checked)
    overhead = checked_s / plain_s - 1
    hook_overhead = statistics.median(in_hooks)
    print(
        f"fit of the ~1M-parameter MLP, {steps} steps of {batch_size} samples, "
        f"ReplicaSyncCheck() at its default every_n_steps=100 (checks at the "
        "start, every 100 steps and at the end):\n"
        f"  A/B: without {plain_s:.2f} s, with {checked_s:.2f} s: "
        f"{overhead * 100:+.1f}%\n"
        f"  time inside the callback's hooks / rest of fit: {hook_overhead * 100:.2f}%"
    )
    return hook_overhead


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run with small sizes")
    args = parser.parse_args(argv)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    print(f"{keras_scaling.describe_strategy(strategy)}\n")
    repeats = 3 if args.quick else 7
    compare_check_costs(strategy, "MLP ~1M", mlp_1m, repeats)
    if not args.quick:
        ratio = compare_check_costs(strategy, "ResNet50", resnet50, repeats)
        print(f"  goal: >= 10x cheaper than naive on ResNet50: {'met' if ratio >= 10 else 'NOT met'}")
    steps = 200 if args.quick else 1000
    overhead = fit_overhead(strategy, steps=steps, batch_size=64, repeats=1 if args.quick else 3)
    print(f"  goal: < 2% overhead at the default frequency: {'met' if overhead < 0.02 else 'NOT met'}")


if __name__ == "__main__":
    main()
