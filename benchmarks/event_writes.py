"""What writing `ThroughputLogger`'s points costs: `fit`'s thread and the whole process.

Run: `python benchmarks/event_writes.py [--rounds N] [--points N]`. It measures
the keras_scaling that Python imports: run it again with `PYTHONPATH=<another
tree>` to compare two trees (alternate the runs: the machine's load moves).

A point is what `ThroughputLogger` writes every `update_freq` steps: one
event of six scalars, after figures that change `throughput.json`. Each
round starts a `ThroughputWriter` in a fresh directory, writes `--points`
points and stops it (the last writes, the flush and the close included).
It prints, per point, the median time the caller spends (`fit`'s thread)
and the median CPU time of the process (every thread, writer threads
included, which compete with training for the interpreter), with their
spread over rounds.
"""

import argparse
import inspect
import os
import statistics
import sys
import tempfile
import threading
import time

import tensorflow as tf  # noqa: F401 - written as in a training process

import keras_scaling
from keras_scaling.throughput import _run_record
from keras_scaling.throughput._writer import ThroughputWriter

TAGS = [
    "throughput/samples_per_sec",
    "throughput/steps_per_sec",
    "throughput/per_replica_samples_per_sec",
    "scaling/speedup",
    "scaling/ideal_speedup",
    "scaling/efficiency",
]
SETUP = {
    "strategy": "MirroredStrategy",
    "num_workers": 1,
    "num_replicas": 2,
    "device_kind": "CPU",
    "per_replica_batch_size": 32,
    "global_batch_size": 64,
    "dtype_policy": "float32",
}


def write_points(points):
    """(caller seconds per point, process CPU seconds per point) of one writer's fit."""
    figures = {"startup_time_s": None}

    def record():
        return _run_record.build_record(SETUP, startup_time_s=figures["startup_time_s"])

    # Trees of this release take (log_dir, record); earlier ones also a lock,
    # held while the figures change, and a `start` call.
    lock = threading.RLock()
    takes_lock = "lock" in inspect.signature(ThroughputWriter).parameters
    writer = ThroughputWriter(tempfile.mkdtemp(), record, *([lock] if takes_lock else []))
    cpu_start_s = time.process_time()
    start_s = time.perf_counter()
    if hasattr(writer, "start"):
        writer.start()
    for step in range(1, points + 1):
        with lock:
            figures["startup_time_s"] = step * 0.001
            writer.changed()
        writer.scalars(step, {tag: step * 1.5 + i for i, tag in enumerate(TAGS)})
    writer.stop()
    return (time.perf_counter() - start_s) / points, (time.process_time() - cpu_start_s) / points


def spread(values):
    median = statistics.median(values)
    return f"{(min(values) / median - 1) * 100:+.0f}%..{(max(values) / median - 1) * 100:+.0f}%"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--points", type=int, default=200)
    args = parser.parse_args(argv)
    write_points(20)  # warm-up: imports, first file
    caller, cpu = [], []
    for _ in range(args.rounds):
        caller_s, cpu_s = write_points(args.points)
        caller.append(caller_s)
        cpu.append(cpu_s)
    print(f"{os.path.dirname(keras_scaling.__file__)}: {args.points} points, {args.rounds} rounds")
    print(
        f"  caller: median {statistics.median(caller) * 1e6:6.1f} us/point ({spread(caller)})   "
        f"process CPU: median {statistics.median(cpu) * 1e6:6.1f} us/point ({spread(cpu)})"
    )


if __name__ == "__main__":
    sys.exit(main())
