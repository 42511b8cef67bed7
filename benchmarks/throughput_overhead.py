"""ThroughputLogger: its cost per step, and how close its figure is to the clock.

Run: `python benchmarks/throughput_overhead.py [--quick] [--replicas N]`

Two measurements, side by side in one process:

1. Overhead. The same compiled model trains `--steps` steps per `fit` with no
   callback, with `ThroughputLogger`, and with
   `keras.callbacks.TensorBoard(update_freq=1)` (Keras' batch-level logging).
   The three alternate `--repeats` times; the medians of the time per step are
   compared. Goals: ThroughputLogger adds less than 1% to a step, and less
   than TensorBoard's batch logging.
2. Accuracy. In separate runs, the samples/sec ThroughputLogger logs for the
   measured steps (summed from its TensorBoard figures) is compared with an
   independent wall-clock measurement of the same steps (clock and optimizer
   counter read by another callback at their first and last step). Goal:
   within 5%. The steady-state median of throughput.json is shown against the
   same wall clock too.

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

    # The logger's first measured interval starts after the first execution
    # (step 1) and its warm-up (5 steps): step 6, at batch index 5.
    first_measured_batch = 5

    class WallClock(keras.callbacks.Callback):
        """Clock and counter at the start and at the end of the measured steps."""

        def on_train_batch_end(self, batch, logs=None):
            if batch == first_measured_batch or batch + 1 >= args.steps:
                iterations = int(model.optimizer.iterations.numpy())
                self.points = getattr(self, "points", []) + [(time.perf_counter(), iterations)]

        def step_time_s(self):
            (first_s, first_it), (last_s, last_it) = self.points[0], self.points[-1]
            return (last_s - first_s) / (last_it - first_it)

    def fit(callbacks):
        """Seconds per step in steady state, and seconds of the whole fit."""
        clock = WallClock()
        start_s = time.perf_counter()
        model.fit(
            dataset,
            steps_per_epoch=args.steps,
            epochs=1,
            verbose=0,
            callbacks=callbacks + [clock],
        )
        return clock.step_time_s(), time.perf_counter() - start_s

    fit([])  # tracing
    step_times_s = {name: [] for name in variants}
    fit_times_s = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, make in variants.items():
            step_time_s, fit_time_s = fit(make())
            step_times_s[name].append(step_time_s)
            fit_times_s[name].append(fit_time_s)

    info = keras_scaling.describe_strategy(strategy)
    print(f"# {info}")
    print(f"# {args.steps} steps per fit, {args.repeats} alternating rounds, "
          f"global batch {args.batch_size}")
    base_step_s = statistics.median(step_times_s["no callback"])
    base_fit_s = statistics.median(fit_times_s["no callback"])
    print(f"{'variant':28} {'step (ms)':>10} {'vs none':>8} {'whole fit (s)':>14} {'vs none':>8}")
    for name in variants:
        step_s = statistics.median(step_times_s[name])
        fit_s = statistics.median(fit_times_s[name])
        print(f"{name:28} {step_s * 1e3:10.4f} {step_s / base_step_s:8.4f} "
              f"{fit_s:14.4f} {fit_s / base_fit_s:8.4f}")
    overhead = statistics.median(step_times_s["ThroughputLogger"]) / base_step_s - 1
    tensorboard = statistics.median(step_times_s["TensorBoard(update_freq=1)"]) / base_step_s - 1
    print(f"steady-state overhead per step: ThroughputLogger {overhead:+.2%} (goal < 1%), "
          f"TensorBoard(update_freq=1) {tensorboard:+.2%}")

    # The logger's own time, which a busy machine distorts far less than the
    # differences above: its batch hook (the counter read every update_freq
    # steps included) after the first execution, per step; and its set-up at
    # the end of the first execution of a fit.
    class TimedLogger(keras_scaling.ThroughputLogger):
        def on_train_begin(self, logs=None):
            self.setup_s, self.hook_s = 0.0, 0.0
            super().on_train_begin(logs)

        def on_train_batch_end(self, batch, logs=None):
            start_s = time.perf_counter()
            super().on_train_batch_end(batch, logs)
            if batch == 0:
                self.setup_s += time.perf_counter() - start_s
            else:
                self.hook_s += time.perf_counter() - start_s

    hook_shares, setups_s = [], []
    for _ in range(args.repeats):
        timed = TimedLogger(fresh_dir(), baseline=None)
        step_time_s, _ = fit([timed])
        hook_shares.append(timed.hook_s / (args.steps - 1) / step_time_s)
        setups_s.append(timed.setup_s)
    print(f"time inside ThroughputLogger's batch hook: median "
          f"{statistics.median(hook_shares):.2%} of a step "
          f"(runs: {', '.join(f'{r:.2%}' for r in hook_shares)}); "
          f"set-up once per fit: median {statistics.median(setups_s) * 1e3:.1f} ms")

    mean_ratios, median_ratios = [], []
    for _ in range(args.repeats):
        log_dir = fresh_dir()
        clock = WallClock()
        model.fit(
            dataset,
            steps_per_epoch=args.steps,
            epochs=1,
            verbose=0,
            callbacks=[keras_scaling.ThroughputLogger(log_dir, baseline=None), clock],
        )
        (first_s, first_it), (last_s, last_it) = clock.points[0], clock.points[-1]
        wall_clock = (last_it - first_it) * args.batch_size / (last_s - first_s)
        logged_mean = _logged_mean_samples_per_sec(log_dir, first_it, args.batch_size)
        with open(os.path.join(log_dir, "throughput.json")) as file:
            logged_median = json.load(file)["samples_per_sec"]
        mean_ratios.append(logged_mean / wall_clock)
        median_ratios.append(logged_median / wall_clock)
    print("logged samples/sec over the measured steps / wall clock over the same steps: "
          f"median {statistics.median(mean_ratios):.4f} "
          f"(runs: {', '.join(f'{r:.4f}' for r in mean_ratios)}; goal 0.95-1.05)")
    print("throughput.json steady-state median / wall-clock mean: "
          f"median {statistics.median(median_ratios):.4f} "
          f"(runs: {', '.join(f'{r:.4f}' for r in median_ratios)}; on a busy "
          "machine slow outliers pull the mean below the median)")
    return 0


def _logged_mean_samples_per_sec(log_dir, start_iterations, global_batch_size):
    """Samples over time summed from the logged figures: steps / steps_per_sec."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import tensorflow as tf

    accumulator = EventAccumulator(
        os.path.join(log_dir, "train"), size_guidance={"tensors": 0}
    )
    accumulator.Reload()
    previous, steps, duration_s = start_iterations, 0, 0.0
    for event in accumulator.Tensors("throughput/steps_per_sec"):
        steps_per_sec = float(tf.make_ndarray(event.tensor_proto))
        steps += event.step - previous
        duration_s += (event.step - previous) / steps_per_sec
        previous = event.step
    return steps * global_batch_size / duration_s


if __name__ == "__main__":
    sys.exit(main())
