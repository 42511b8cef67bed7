"""Throughput of `fit` with `steps_per_execution` 1, 4 and 16 on 2 replicas.

Runs a small model under `MirroredStrategy` over logical CPUs (with
`keras_scaling.compat`, which makes `steps_per_execution > 1` work on several
replicas) and prints samples/sec for each value and its ratio to
`steps_per_execution=1`. The values are measured side by side, in rounds that
alternate between them, so that a change of machine load affects all alike;
each figure is the median over the rounds.

    python benchmarks/steps_per_execution.py            # about a minute
    python benchmarks/steps_per_execution.py --quick    # a few seconds
"""

import argparse
import statistics
import time

import numpy as np

import keras_scaling


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2, help="logical CPUs (default 2)")
    parser.add_argument(
        "--steps-per-execution",
        type=int,
        nargs="+",
        default=[1, 4, 16],
        help="values to compare; the first is the baseline (default 1 4 16)",
    )
    parser.add_argument("--per-replica-batch-size", type=int, default=16, help="default 16")
    parser.add_argument("--steps-per-round", type=int, default=128, help="default 128")
    parser.add_argument("--rounds", type=int, default=5, help="default 5")
    parser.add_argument("--quick", action="store_true", help="32 steps per round, 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps_per_round, args.rounds = 32, 2
    for name in ("replicas", "per_replica_batch_size", "steps_per_round", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if min(args.steps_per_execution) < 1:
        parser.error("--steps-per-execution values must be at least 1")
    return args


def make_model(strategy, steps_per_execution):
    import keras

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse", steps_per_execution=steps_per_execution)
    return model


def main(argv=None):
    args = parse_args(argv)
    keras_scaling.use_logical_cpus(args.replicas)
    strategy = keras_scaling.auto_strategy()
    global_batch_size = args.per_replica_batch_size * strategy.num_replicas_in_sync
    num_samples = global_batch_size * args.steps_per_round
    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_samples, 32)).astype("float32")
    y = rng.normal(size=(num_samples, 1)).astype("float32")

    def fit_once(model):
        start_s = time.perf_counter()
        model.fit(x, y, batch_size=global_batch_size, epochs=1, shuffle=False, verbose=0)
        return time.perf_counter() - start_s

    models = {}
    for steps_per_execution in args.steps_per_execution:
        models[steps_per_execution] = make_model(strategy, steps_per_execution)
        fit_once(models[steps_per_execution])  # traces and warms up
    samples_per_sec = {value: [] for value in models}
    for _ in range(args.rounds):
        for steps_per_execution, model in models.items():
            samples_per_sec[steps_per_execution].append(num_samples / fit_once(model))

    baseline = args.steps_per_execution[0]
    median = {value: statistics.median(runs) for value, runs in samples_per_sec.items()}
    print(
        f"{keras_scaling.describe_strategy(strategy)}; global batch "
        f"{global_batch_size}, {args.steps_per_round} steps per round, "
        f"{args.rounds} rounds (median)"
    )
    print(f"{'steps_per_execution':>20} {'samples/sec':>12} {'ratio':>7}")
    for value in args.steps_per_execution:
        print(f"{value:>20} {median[value]:>12.0f} {median[value] / median[baseline]:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
