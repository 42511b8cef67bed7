"""Cost of `ReplicaSyncCheck`: one check against a naive way, and what it adds to `fit`.

Runs on a MirroredStrategy over 2 logical CPUs and prints, side by side:

1. For a ~1M-parameter MLP and for ResNet50 (weights=None, 32x32x3 inputs,
   10 classes, ~23.5M parameters), with Adam (so the optimizer's slots are
   compared too): the time of one check (fingerprints on the devices, a
   small table to the host) against the naive way (every replica's copy of
   every variable to NumPy, compared bitwise with replica 0's), as a ratio.
   The first check, which traces and compiles the fingerprint function, is
   reported separately.
2. Whole `fit` calls of the MLP (a few hundred steps, so a fixed cost per
   `fit` shows), in alternating rounds: without the callback, with
   `ReplicaSyncCheck()` at its default `every_n_steps=100` (checks at the
   start, every 100 steps and at the end), and a plain `fit` of the same
   model right after one with the callback (nothing may be left behind that
   slows it). Each arm prints the median wall-clock time of `fit` and its
   spread; the goal is judged on the ratio of the medians, with and
   without. It also prints the time from the last `on_train_end` to the
   return of `fit` (where Keras releases the epoch's iterator), with and
   without the callback.

3. The fingerprint itself, today's against the plain sum of 64-bit words
   it replaced (which did not see permutations or changes that cancel):
   one compiled function in which each replica fingerprints its copy of
   every variable of the MLP and of ResNet50 with Adam, the two variants
   in alternating rounds, median time of each and the ratio of medians.

Goals: the check at least 10 times cheaper than the naive way on ResNet50;
`fit` with the callback at its default frequency within 1% of `fit`
without it (ratio of medians), and the plain `fit` after it too. On a
loaded machine the spread of single fits is far above 1%: the verdict says
when the spread leaves it undecided.

Usage:
    python benchmarks/replica_sync.py               # full run
    python benchmarks/replica_sync.py --rounds 11   # more rounds
    python benchmarks/replica_sync.py --quick       # smoke run, small sizes
    python benchmarks/replica_sync.py --fingerprints-only --rounds 15
"""

import argparse
import statistics
import time

import keras_scaling

keras_scaling.use_logical_cpus(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_scaling.replica_sync import _fingerprint, replica_state  # noqa: E402
from keras_scaling.replica_sync.replica_sync_check import ReplicaSyncCheck  # noqa: E402

# Goal of the fit rows: within 1% of fit without the callback.
GOAL = 0.01


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


def sum_of_words_table(tensors):
    """The fingerprint this project used before: the 64-bit words summed, position-blind."""
    constants = _fingerprint._SharedConstants()
    return tf.stack(
        [
            tf.reduce_sum(_fingerprint._words(tf.convert_to_tensor(t), constants), constants(0))
            for t in tensors
        ]
    )


def fingerprint_all_function(strategy, variables, table):
    """A compiled function in which every replica fingerprints its copy of each variable."""
    tf_variables = [v.variable for v in variables]

    @tf.function(autograph=False)
    def fingerprint_all():
        return strategy.run(lambda: table([tf.identity(v) for v in tf_variables]))

    def run():
        for row in strategy.experimental_local_results(fingerprint_all()):
            row.numpy()

    return run


def compare_fingerprints(strategy, name, make_model, rounds):
    """Median time of today's fingerprint and of the sum of words, alternating rounds."""
    model = build(strategy, make_model)
    variables = replica_state.tracked_variables(model, model.optimizer)
    variants = {
        "sum of words (before)": fingerprint_all_function(strategy, variables, sum_of_words_table),
        "position-weighted (now)": fingerprint_all_function(
            strategy, variables, _fingerprint.fingerprint_table
        ),
    }
    times = {label: [] for label in variants}
    for run in variants.values():
        run()  # traces and compiles
    labels = list(variants)
    for round_index in range(rounds):
        for label in labels if round_index % 2 == 0 else labels[::-1]:
            start = time.perf_counter()
            variants[label]()
            times[label].append(time.perf_counter() - start)
    medians = {label: statistics.median(values) for label, values in times.items()}
    print(f"{name}: fingerprints of {len(variables)} variables on every replica, {rounds} rounds")
    for label, values in times.items():
        print(f"  {label:<22} median {medians[label] * 1e3:.2f} ms, spread {spread(values)}")
    before, now = (medians[label] for label in labels)
    print(f"  now / before: {now / before:.2f} (ratio of medians)")
    return now / before


class _EndTime(keras.callbacks.Callback):
    """Notes when the last `on_train_end` ran (it is the last callback)."""

    end_s = None

    def on_train_end(self, logs=None):
        self.end_s = time.perf_counter()


def timed_fit_s(model, dataset, callbacks):
    """(wall-clock of `fit`, time from the last `on_train_end` to its return)."""
    end = _EndTime()
    start = time.perf_counter()
    model.fit(dataset, verbose=0, callbacks=[*callbacks, end])
    returned = time.perf_counter()
    return returned - start, returned - end.end_s


def spread(values):
    """`min-max` of `values` around their median, in percent of the median."""
    median = statistics.median(values)
    return f"{(min(values) / median - 1) * 100:+.1f}%..{(max(values) / median - 1) * 100:+.1f}%"


def fit_overhead(strategy, steps, batch_size, rounds):
    """Ratio of median `fit` times, with / without the callback, and after / without."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch_size, 512)).astype("float32")
    y = rng.integers(0, 10, size=(steps * batch_size,))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).cache()
    plain_model, checked_model = build(strategy, mlp_1m), build(strategy, mlp_1m)
    check = ReplicaSyncCheck()
    # Traces the train functions, and the check's fingerprint function once:
    # a one-time cost per callback, reported as "first check" above.
    plain_model.fit(dataset, verbose=0)
    checked_model.fit(dataset, verbose=0, callbacks=[check])
    arms = {"without": [], "with": [], "after": []}
    tails = {"without": [], "with": [], "after": []}

    def run(arm):
        model = plain_model if arm == "without" else checked_model
        fit_s, tail_s = timed_fit_s(model, dataset, [check] if arm == "with" else [])
        arms[arm].append(fit_s)
        tails[arm].append(tail_s)

    # Alternate the order so that load changes on the machine hit every arm alike.
    for round_index in range(rounds):
        order = ("without", "with", "after")
        if round_index % 2:
            order = ("with", "after", "without")
        for arm in order:
            run(arm)
    medians = {arm: statistics.median(times) for arm, times in arms.items()}
    print(
        f"fit of the ~1M-parameter MLP, {steps} steps of {batch_size} samples, "
        f"{rounds} alternating rounds; ReplicaSyncCheck() at its default "
        "every_n_steps=100:"
    )
    labels = {
        "without": "without the callback",
        "with": "with ReplicaSyncCheck()",
        "after": "plain fit after one with it",
    }
    for arm, times in arms.items():
        print(
            f"  {labels[arm]:<28} median {medians[arm]:.2f} s, spread {spread(times)}; "
            f"on_train_end -> return: median {statistics.median(tails[arm]) * 1e3:.0f} ms, "
            f"max {max(tails[arm]) * 1e3:.0f} ms, "
            f"{sum(t > 0.5 for t in tails[arm])} of {rounds} over 0.5 s"
        )
    ratios = {arm: medians[arm] / medians["without"] for arm in ("with", "after")}
    noise = max(max(abs(v / medians[arm] - 1) for v in times) for arm, times in arms.items())
    for arm, ratio in ratios.items():
        verdict = "met" if ratio - 1 < GOAL else "NOT met"
        if abs(ratio - 1) < noise and noise > GOAL:
            verdict += f" (undecided: single fits spread by up to {noise * 100:.0f}%)"
        print(
            f"  goal: {labels[arm]} / without the callback < {1 + GOAL:.2f} "
            f"(ratio of medians): {ratio:.3f}, {verdict}"
        )
    return ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run with small sizes")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds of fit")
    parser.add_argument("--steps", type=int, default=None, help="steps per fit")
    parser.add_argument(
        "--fingerprints-only",
        action="store_true",
        help="only compare today's fingerprint with the sum of words it replaced",
    )
    args = parser.parse_args(argv)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    print(f"{keras_scaling.describe_strategy(strategy)}\n")
    fingerprint_rounds = args.rounds or (5 if args.quick else 15)
    compare_fingerprints(strategy, "MLP ~1M", mlp_1m, fingerprint_rounds)
    if not args.quick:
        compare_fingerprints(strategy, "ResNet50", resnet50, fingerprint_rounds)
    if args.fingerprints_only:
        return
    repeats = 3 if args.quick else 7
    compare_check_costs(strategy, "MLP ~1M", mlp_1m, repeats)
    if not args.quick:
        ratio = compare_check_costs(strategy, "ResNet50", resnet50, repeats)
        print(
            f"  goal: >= 10x cheaper than naive on ResNet50: {'met' if ratio >= 10 else 'NOT met'}"
        )
    steps = args.steps or (60 if args.quick else 250)
    rounds = args.rounds or (3 if args.quick else 9)
    fit_overhead(strategy, steps=steps, batch_size=64, rounds=rounds)


if __name__ == "__main__":
    main()
