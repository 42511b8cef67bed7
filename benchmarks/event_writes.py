"""What writing a point to keras_scaling's event file costs: the hand-made writer it replaced, against TensorBoard's own.

Run: `python benchmarks/event_writes.py [--rounds N] [--points N] [--before PATH]`

A point is what `ThroughputLogger` writes every `update_freq` steps: one event
of six scalars. Each round writes `--points` points into a fresh directory
with each variant, in alternating order, then flushes:

- "before": the `_tensorboard.py` of keras_scaling 0.1 (`--before`, a path to
  that file): events hand-encoded in protobuf's wire format, framed and
  checksummed by TensorFlow's `TFRecordWriter` in C++, in the caller's thread;
- "now": this tree's `_tensorboard.py`: events built with TensorBoard's
  protobuf classes and written by TensorBoard's `EventFileWriter`, whose own
  thread frames and checksums them (in Python).

It prints, per point, the median time the caller spends (the writing thread:
for `ThroughputLogger` its save thread, never `fit`'s loop) and the median
CPU time of the whole process (every thread, the writer's included, which
competes with training for the interpreter), with their spread over rounds.
"""

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

import tensorflow as tf  # noqa: F401 - both variants write as in a training process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAGS = [
    "throughput/samples_per_sec",
    "throughput/steps_per_sec",
    "throughput/samples_per_sec_per_replica",
    "scaling/speedup",
    "scaling/ideal_speedup",
    "scaling/efficiency",
]


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_points(module, points):
    """(caller seconds per point, process CPU seconds per point), the flush and close included."""
    log_dir = tempfile.mkdtemp()
    hold = getattr(module, "hold", None)
    if hold is not None:
        hold(log_dir)
    cpu_start_s = time.process_time()
    start_s = time.perf_counter()
    for step in range(points):
        module.write_scalars(log_dir, step, {tag: step * 1.5 + i for i, tag in enumerate(TAGS)})
    caller_s = time.perf_counter() - start_s
    module.flush(log_dir)
    if hold is not None:
        module.release(log_dir)
    return caller_s / points, (time.process_time() - cpu_start_s) / points


def spread(values):
    median = statistics.median(values)
    return f"{(min(values) / median - 1) * 100:+.0f}%..{(max(values) / median - 1) * 100:+.0f}%"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--points", type=int, default=500)
    parser.add_argument("--before", required=True, help="keras_scaling 0.1's _tensorboard.py")
    args = parser.parse_args(argv)
    variants = {
        "before": load("tensorboard_before", args.before),
        "now": load("tensorboard_now", os.path.join(ROOT, "keras_scaling", "_tensorboard.py")),
    }
    for module in variants.values():
        write_points(module, 50)  # warm-up: imports, first file
    caller = {name: [] for name in variants}
    cpu = {name: [] for name in variants}
    names = list(variants)
    for round_index in range(args.rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            caller_s, cpu_s = write_points(variants[name], args.points)
            caller[name].append(caller_s)
            cpu[name].append(cpu_s)
    print(
        f"{args.points} points of {len(TAGS)} scalars per round, {args.rounds} alternating rounds"
    )
    for name in names:
        print(
            f"  {name:<7} caller: median {statistics.median(caller[name]) * 1e6:6.1f} us/point "
            f"({spread(caller[name])})   process CPU: median "
            f"{statistics.median(cpu[name]) * 1e6:6.1f} us/point ({spread(cpu[name])})"
        )
    for label, figures in (("caller", caller), ("process CPU", cpu)):
        ratio = statistics.median(figures["now"]) / statistics.median(figures["before"])
        print(f"  now / before, {label}: {ratio:.2f}")


if __name__ == "__main__":
    sys.exit(main())
