"""Each worker reads only its own share, once per epoch, in as many steps as the others."""

import io
import json
import logging
import os
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from keras_scaling import data
from keras_scaling.devices import StrategyInfo
from keras_scaling.launch import launcher


def _worker(num_workers, worker_index, replicas_per_worker=2):
    return StrategyInfo(
        kind="MultiWorkerMirroredStrategy",
        num_workers=num_workers,
        worker_index=worker_index,
        is_chief=worker_index == 0,
        num_replicas=num_workers * replicas_per_worker,
        local_devices=("/cpu:0",) * replicas_per_worker,
        device_kind="CPU",
    )


def _epochs_of_every_worker(source, num_workers, epochs=1, **kwargs):
    """Builds each worker's dataset as that worker would, and reads `epochs` epochs.

    Returns, per worker, a list of epochs, each a list of (ids, weights) batches.
    """
    readings = []
    for worker_index in range(num_workers):
        dataset = data._distribute_for(source, _worker(num_workers, worker_index), **kwargs)
        readings.append(
            (
                data.plan_of(dataset),
                [list(dataset.as_numpy_iterator()) for _ in range(epochs)],
            )
        )
    return readings


def _real_ids(batches):
    ids = []
    for batch in batches:
        if len(batch) == 3:
            ids.extend(batch[0][batch[2] > 0].tolist())
        else:
            ids.extend(batch[0].tolist())
    return ids


@pytest.mark.parametrize("num_workers", [2, 3])
@pytest.mark.parametrize("last_batch", ["drop", "pad"])
def test_workers_split_each_shuffled_epoch_exactly(num_workers, last_batch):
    ids = np.arange(1001)
    readings = _epochs_of_every_worker(
        (ids, ids), num_workers, epochs=2, per_replica_batch_size=8, last_batch=last_batch
    )
    plans = [plan for plan, _ in readings]
    assert len({plan.steps_per_epoch for plan in plans}) == 1
    for epoch in range(2):
        seen = []
        for plan, epochs in readings:
            batches = epochs[epoch]
            # One batch of the global size lasts num_workers steps on its worker.
            assert len(batches) * num_workers == plan.steps_per_epoch
            assert {len(batch[0]) for batch in batches} == {plan.global_batch_size}
            seen.extend(_real_ids(batches))
        assert len(seen) == len(set(seen)), f"epoch {epoch}: a sample read by two workers"
        assert len(seen) == 1001 - plans[0].samples_dropped_per_epoch
        if last_batch == "pad":
            assert sorted(seen) == list(range(1001))
    first_epoch = [_real_ids(epochs[0]) for _, epochs in readings]
    second_epoch = [_real_ids(epochs[1]) for _, epochs in readings]
    assert first_epoch != second_epoch, "every epoch must have a new order"


def _write_records(path, values):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for value in values:
            feature = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
            example = tf.train.Example(features=tf.train.Features(feature={"id": feature}))
            writer.write(example.SerializeToString())
    return str(path)


def _parse(record):
    parsed = tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64)})
    return parsed["id"], parsed["id"]


def test_enough_files_are_split_between_workers_by_file(tmp_path):
    bounds = [0, 40, 70, 130, 150, 203]
    paths = [
        _write_records(tmp_path / f"part-{i}.tfrecord", range(start, end))
        for i, (start, end) in enumerate(zip(bounds, bounds[1:]))
    ]
    readings = _epochs_of_every_worker(
        paths, 2, per_replica_batch_size=4, last_batch="pad", parse_fn=_parse
    )
    plans = [plan for plan, _ in readings]
    assert {plan.shard_mode for plan in plans} == {"file"}
    assert sorted(plan.worker_files for plan in plans) == [2, 3]
    shares = [set(_real_ids(epochs[0])) for _, epochs in readings]
    assert not shares[0] & shares[1]
    assert sorted(shares[0] | shares[1]) == list(range(203))
    assert len({len(epochs[0]) for _, epochs in readings}) == 1


def test_too_few_files_fall_back_to_element_sharding_with_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="keras_scaling")
    path = _write_records(tmp_path / "only.tfrecord", range(50))
    readings = _epochs_of_every_worker(
        [path], 2, per_replica_batch_size=4, last_batch="pad", parse_fn=_parse
    )
    assert {plan.shard_mode for plan, _ in readings} == {"element"}
    assert "Only 1 file(s) for 2 workers" in caplog.text
    shares = [set(_real_ids(epochs[0])) for _, epochs in readings]
    assert not shares[0] & shares[1] and sorted(shares[0] | shares[1]) == list(range(50))


def test_partial_last_batch_is_refused_with_several_workers():
    with pytest.raises(ValueError, match="same number of steps"):
        data._distribute_for(
            np.arange(10), _worker(2, 0), global_batch_size=4, last_batch="partial"
        )


_WORKER_SCRIPT = textwrap.dedent(
    """
    import json
    import os
    import numpy as np
    import tensorflow as tf
    from keras_scaling import data

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ids = np.arange(1001)
    for last_batch in ("pad", "drop"):
        dataset = data.distribute((ids, ids), strategy=strategy, per_replica_batch_size=32,
                                  last_batch=last_batch)
        plan = data.plan_of(dataset)
        steps, seen = 0, []
        for batch in strategy.experimental_distribute_dataset(dataset):
            steps += 1
            parts = [strategy.experimental_local_results(part) for part in batch]
            for replica in range(len(parts[0])):
                x = parts[0][replica].numpy()
                if len(parts) == 3:
                    x = x[parts[2][replica].numpy() > 0]
                seen.extend(x.tolist())
        print("RESULT " + json.dumps({
            "last_batch": last_batch, "worker": plan.worker_index,
            "num_workers": plan.num_workers, "steps": steps,
            "planned_steps": plan.steps_per_epoch,
            "dropped": plan.samples_dropped_per_epoch, "seen": seen}), flush=True)

    import keras

    class CountSteps(keras.callbacks.Callback):
        steps = 0

        def on_train_batch_end(self, batch, logs=None):
            CountSteps.steps += 1

    x = np.random.default_rng(0).normal(size=(1001, 4)).astype("float32")
    train = data.distribute((x, x.sum(axis=1)), strategy=strategy, per_replica_batch_size=32)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(train, epochs=1, verbose=0, callbacks=[CountSteps()])
    print("RESULT " + json.dumps({
        "last_batch": "fit", "worker": data.plan_of(train).worker_index,
        "steps": CountSteps.steps,
        "planned_steps": data.plan_of(train).steps_per_epoch}), flush=True)
    # Skips TensorFlow's shutdown barrier, which waits ~20 s for the cluster.
    os._exit(0)
    """
)


def _run_two_workers(tmp_path):
    """Runs the worker script as 2 workers of `launch`; returns {last_batch: [result, ...]}."""
    script = tmp_path / "worker.py"
    script.write_text(_WORKER_SCRIPT)
    output = io.StringIO()
    outcome = launcher.launch(
        [sys.executable, str(script)],
        num_workers=2,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        stdout=output,
        stderr=output,
    )
    assert outcome.exit_code == 0, f"{outcome.message}\n{output.getvalue()[-3000:]}"
    results = {}
    for line in output.getvalue().splitlines():
        _, _, payload = line.partition("] ")
        if payload.startswith("RESULT "):
            result = json.loads(payload[len("RESULT ") :])
            results.setdefault(result["last_batch"], []).append(result)
    assert sorted(results) == ["drop", "fit", "pad"], output.getvalue()[-3000:]
    assert all(len(both) == 2 for both in results.values()), results
    return results


@pytest.fixture(scope="module")
def two_worker_results(tmp_path_factory):
    return _run_two_workers(tmp_path_factory.mktemp("two_workers"))


@pytest.mark.timeout(240)
def test_two_real_workers_read_disjoint_shares_in_equal_steps(two_worker_results):
    for last_batch in ("pad", "drop"):
        results = two_worker_results[last_batch]
        assert sorted(result["worker"] for result in results) == [0, 1]
        assert {result["num_workers"] for result in results} == {2}
        assert {result["steps"] for result in results} == {results[0]["planned_steps"]}
        seen = [value for result in results for value in result["seen"]]
        assert len(seen) == len(set(seen)), f"{last_batch}: a sample was read by both workers"
        assert len(seen) == 1001 - results[0]["dropped"]
        if last_batch == "pad":
            assert sorted(seen) == list(range(1001))


@pytest.mark.timeout(240)
def test_fit_on_two_real_workers_runs_the_planned_steps(two_worker_results):
    results = two_worker_results["fit"]
    assert [result["steps"] for result in results] == [results[0]["planned_steps"]] * 2


def test_cached_shares_stay_disjoint_and_are_reshuffled_each_epoch():
    source = tf.data.Dataset.range(200).map(lambda i: (i, i))
    readings = _epochs_of_every_worker(
        source, 2, epochs=2, per_replica_batch_size=4, last_batch="pad", shuffle=True, cache=True
    )
    for epoch in range(2):
        shares = [set(_real_ids(epochs[epoch])) for _, epochs in readings]
        assert not shares[0] & shares[1]
        assert sorted(shares[0] | shares[1]) == list(range(200))
    worker_0 = readings[0][1]
    assert _real_ids(worker_0[0]) != _real_ids(worker_0[1])


def test_parse_fn_runs_on_each_workers_share_of_arrays():
    ids = np.arange(100)
    readings = _epochs_of_every_worker(
        ids,
        2,
        per_replica_batch_size=4,
        last_batch="pad",
        parse_fn=lambda i: (i, i * 10),
    )
    for _, epochs in readings:
        for x, y, weights in epochs[0]:
            np.testing.assert_array_equal(y[weights > 0], x[weights > 0] * 10)
    shares = [set(_real_ids(epochs[0])) for _, epochs in readings]
    assert not shares[0] & shares[1] and sorted(shares[0] | shares[1]) == list(range(100))
