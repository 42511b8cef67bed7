"""ThroughputLogger: its cost per step, and how close its figure is to the clock.

Run: `python benchmarks/throughput_overhead.py [--quick] [--replicas N]`

Two measurements, side by side in one process:

1. Overhead. The same compiled model trains `--steps` steps per `fit` with no
   callback, with `ThroughputLogger`, and with
   `keras.callbacks.TensorBoard(update_freq=1)` (Keras' batch-level logging).
   The three alternate `--repeats` times; the medians of the time per step are
   compared. Goals: ThroughputLogger adds less than 1% to a step, and less
   than TensorBoard's batch logging.
2. Accuracy. In separate runs, the steady-state samples/sec that
   ThroughputLogger writes to throughput.json is compared with an independent
   wall-clock measurement of the same steps (clock and optimizer counter read
   once at the end of the first and of the last execution). Goal: within 5%.

The model is small on purpose: the shorter the step, the larger any
per-step cost looks.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--steps", type=int, default=None, help="steps per fit")
    parser.add_argument("--repeats", type=int, default=None, help="rounds of the variants")
    parser.add_argument("--replicas", type=int, default=1, help="logical CPU replicas")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    args = parser.parse_args(argv)
    args.steps = args.steps or (300 if args.quick else 2000)
    args.repeats = args.repeats or (3 if args.quick else 7)
    return args


def main(argv=None):
    args = parse_args(argv)
    import keras_scaling

    if args.replicas > 1:
        keras_scaling.use_logical_cpus(args.replicas)
    import keras
    import tensorflow as tf

    strategy = keras_scaling.auto_strategy()
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="sgd", loss="mse")
    batch = (
        tf.zeros((args.batch_size, 32), tf.float32),
        tf.zeros((args.batch_size, 1), tf.float32),
    )
    dataset = tf.data.Dataset.from_tensors(batch).repeat().prefetch(2)
    scratch = tempfile.mkdtemp(prefix="throughput_overhead_")
    run_index = [0]

    def fresh_dir():
        run_index[0] += 1
        return os.path.join(scratch, f"run{run_index[0]}")

    variants = {
        "no callback": lambda: [],
        "ThroughputLogger": lambda: [
            keras_scaling.ThroughputLogger(fresh_dir(), baseline=None)
        ],
        "TensorBoard(update_freq=1)": lambda: [
            keras.callbacks.TensorBoard(fresh_dir(), update_freq=1, write_graph=False)
        ],
    }

    def fit(callbacks):
        start_s = time.perf_counter()
        model.fit(
            dataset, steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=callbacks
        )
        return time.perf_counter() - start_s

    fit([])  # tracing
    step_times_s = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, make in variants.items():
            step_times_s[name].append(fit(make()) / args.steps)

    info = keras_scaling.describe_strategy(strategy)
    print(f"# {info}")
    print(f"# {args.steps} steps per fit, {args.repeats} alternating rounds, "
          f"global batch {args.batch_size}")
    base_s = statistics.median(step_times_s["no callback"])
    print(f"{'variant':30} {'median step (ms)':>17} {'vs no callback':>15}")
    for name, times in step_times_s.items():
        median_s = statistics.median(times)
        print(f"{name:30} {median_s * 1e3:17.4f} {median_s / base_s:15.4f}")
    overhead = statistics.median(step_times_s["ThroughputLogger"]) / base_s - 1
    tensorboard = statistics.median(step_times_s["TensorBoard(update_freq=1)"]) / base_s - 1
    print(f"ThroughputLogger overhead: {overhead:+.2%} of a step (goal < 1%); "
          f"TensorBoard(update_freq=1): {tensorboard:+.2%}")

    class WallClock(keras.callbacks.Callback):
        """Clock and counter at the end of the first and the last execution."""

        def on_train_batch_end(self, batch, logs=None):
            if batch == 0 or batch + 1 >= args.steps:
                iterations = int(model.optimizer.iterations.numpy())
                self.points = getattr(self, "points", []) + [(time.perf_counter(), iterations)]

    ratios = []
    for _ in range(args.repeats):
        log_dir = fresh_dir()
        clock = WallClock()
        fit([keras_scaling.ThroughputLogger(log_dir, baseline=None), clock])
        with open(os.path.join(log_dir, "throughput.json")) as file:
            logged = json.load(file)["samples_per_sec"]
        (first_s, first_it), (last_s, last_it) = clock.points[0], clock.points[-1]
        wall_clock = (last_it - first_it) * args.batch_size / (last_s - first_s)
        ratios.append(logged / wall_clock)
    ratio = statistics.median(ratios)
    print(f"logged steady-state samples/sec / wall-clock samples/sec: median {ratio:.4f} "
          f"(runs: {', '.join(f'{r:.4f}' for r in ratios)}; goal within 0.95-1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
