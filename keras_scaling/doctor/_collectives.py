"""The doctor's collectives; every worker must run the same ones in the same order."""

import itertools
import json
import time

import numpy as np
import tensorflow as tf

from keras_scaling.internals import _probes

# One worker's report as JSON; the same length on every worker, for the all-gather.
REPORT_BYTES = 1024


def _first_local(strategy, result):
    return strategy.experimental_local_results(result)[0]


# Keys of its own per exchange (every worker runs them in the same order): a key cannot be written twice.
_exchange_numbers = itertools.count()


@_probes.guarded(
    "tf.coordination_key_value_store",
    reaches="tensorflow.python.eager.context.context(): coordination_service, set_config_key_value, get_config_key_value",
    lost="keras-scaling doctor sends the workers' reports through an all-gather: workers whose devices differ wait there until --timeout instead of failing at once",
    workaround="Check that every worker has the same devices before running doctor.",
)
def _key_value_store():
    from tensorflow.python.eager import context

    store = context.context()
    if store.coordination_service is None:
        raise _probes.ReachError("the strategy started no coordination service")
    if not (callable(store.set_config_key_value) and callable(store.get_config_key_value)):
        raise _probes.ReachError("the context has no key-value methods")
    return store


def exchange_reports(strategy, report, num_workers, wait_s):
    """The reports sent within `wait_s`, in worker order, by the coordination service's key-value store.

    No collective, which workers with differing devices would wait in forever (without the store,
    `gather_reports`). Worker 0 serves the keys: it returns once every other worker read them.
    """
    if num_workers == 1:
        return [report]
    store = _key_value_store()
    if store is None:
        return gather_reports(strategy, report)
    prefix = f"keras_scaling/doctor/{next(_exchange_numbers)}"
    store.set_config_key_value(f"{prefix}/report/{report['worker']}", json.dumps(report))
    texts = [
        _wait_for_key(store, f"{prefix}/report/{index}", wait_s) for index in range(num_workers)
    ]
    reports = [json.loads(text) for text in texts if text is not None]
    if report["worker"] != 0:
        store.set_config_key_value(f"{prefix}/read/{report['worker']}", "1")
    else:
        for other in reports[1:]:
            _wait_for_key(store, f"{prefix}/read/{other['worker']}", wait_s)
    return reports


def _wait_for_key(store, key, wait_s):
    try:
        return store.get_config_key_value(key, max(1, round(wait_s * 1000)))
    except tf.errors.OpError:  # DeadlineExceeded: nobody wrote it; Unavailable: worker 0 has gone
        return None


def gather_reports(strategy, report):
    """Every worker's `report` in worker order, by an all-gather."""
    data = json.dumps(report, sort_keys=True).encode("utf-8")
    if len(data) > REPORT_BYTES:
        raise ValueError(f"worker report is {len(data)} bytes, more than {REPORT_BYTES}: {report}")
    row = np.frombuffer(data.ljust(REPORT_BYTES, b"\0"), dtype=np.uint8).astype(np.int32)
    encoded = tf.constant(row[None, :])

    @tf.function
    def replica_fn():
        return tf.distribute.get_replica_context().all_gather(encoded, axis=0)

    rows = _first_local(strategy, strategy.run(replica_fn)).numpy()
    # Rows need not be one per replica (one per worker over logical CPUs).
    by_worker: dict[int, dict] = {}
    for row in rows:
        decoded = json.loads(bytes(int(value) for value in row).rstrip(b"\0").decode("utf-8"))
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
    """The seconds of each of `rounds` all-reduces of a mirrored variable of `num_floats` float32, after an untimed one."""
    with strategy.scope():
        mirrored = tf.Variable(tf.ones([num_floats]), trainable=False)

    @tf.function
    def replica_fn():
        value = tf.identity(mirrored)
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value)

    def one_round():
        start = time.perf_counter()
        # Reading one element waits for the collective without copying the tensor.
        _first_local(strategy, strategy.run(replica_fn))[0].numpy()
        return time.perf_counter() - start

    one_round()
    return [one_round() for _ in range(rounds)]
