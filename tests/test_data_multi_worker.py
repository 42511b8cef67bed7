"""Each worker reads only its own share, once per epoch, in as many steps as the others.

Each worker's dataset is built as that worker would build it
(`_distribute_for` with its `StrategyInfo`);
`tests/test_data_pass_order_multi_worker.py` reads and fits on shares on 2
real workers.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

from keras_scaling import data
from keras_scaling.devices import StrategyInfo


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
