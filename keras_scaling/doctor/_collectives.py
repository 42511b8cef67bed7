"""The doctor's collectives: what every replica sends, and what comes back.

Each function runs one collective through `strategy.run`, so every worker
must call the same ones in the same order, as in training.
"""

import json
import time

import numpy as np
import tensorflow as tf

# Room for one worker's report (host name, pid, four version strings) as
# JSON; every worker must use the same length for the all-gather to match.
REPORT_BYTES = 1024


def _encode(report):
    data = json.dumps(report, sort_keys=True).encode("utf-8")
    if len(data) > REPORT_BYTES:
        raise ValueError(f"worker report is {len(data)} bytes, more than {REPORT_BYTES}: {report}")
    return np.frombuffer(data.ljust(REPORT_BYTES, b"\0"), dtype=np.uint8).astype(np.int32)


def _decode(row):
    data = bytes(int(value) for value in row).rstrip(b"\0")
    return json.loads(data.decode("utf-8"))


def _first_local(strategy, result):
    return strategy.experimental_local_results(result)[0]


def gather_reports(strategy, report):
    """Every worker's `report` dict (which holds its `"worker"` index), by an all-gather.

    Returns the reports in worker order, one per worker that took part.
    """
    encoded = tf.constant(_encode(report)[None, :])

    @tf.function
    def replica_fn():
        return tf.distribute.get_replica_context().all_gather(encoded, axis=0)

    rows = _first_local(strategy, strategy.run(replica_fn)).numpy()
    # One report per worker, by the index each worker wrote into its own:
    # the gathered rows need not be one per replica (a multi-worker strategy
    # over logical CPUs gathers one row per worker).
    by_worker: dict[int, dict] = {}
    for row in rows:
        decoded = _decode(row)
        by_worker.setdefault(decoded["worker"], decoded)
    return [by_worker[index] for index in sorted(by_worker)]


def all_reduce_known_values(strategy, num_values):
    """Sums, over the replicas, a tensor whose elements are r + 1 on replica r."""

    @tf.function
    def replica_fn():
        context = tf.distribute.get_replica_context()
        value = tf.cast(context.replica_id_in_sync_group + 1, tf.float32)
        return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.fill([num_values], value))

    return _first_local(strategy, strategy.run(replica_fn)).numpy().tolist()


def time_all_reduce(strategy, num_floats, rounds):
    """The seconds each of `rounds` all-reduces (sum) of `num_floats` float32 took.

    One untimed round first traces the function and sets up the collective.
    The tensor is a mirrored variable, made on the replicas' devices before
    the clock starts, so each round times the all-reduce alone.
    """
    with strategy.scope():
        mirrored = tf.Variable(tf.ones([num_floats]), trainable=False)

    @tf.function
    def replica_fn():
        value = tf.identity(mirrored)
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value)

    def one_round():
        start = time.perf_counter()
        result = strategy.run(replica_fn)
        # Reading one element waits for the collective without copying the tensor.
        _first_local(strategy, result)[0].numpy()
        return time.perf_counter() - start

    one_round()
    return [one_round() for _ in range(rounds)]
