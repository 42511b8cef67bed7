"""The data people already have goes into distribute() as it is.

Keras' dataset utilities, a pipeline ending in `.batch()`, a `PyDataset` and
a generator, on 2 replicas (this file's `logical_cpus(2)` tests) and as each
of 2 workers would read them (`_distribute_for` with a worker's
`StrategyInfo`); `tests/multi_worker/test_multi_worker_training.py` runs them
on 2 real workers. Bad input is checked on one device.
"""

import logging
import math
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_scaling import data
from keras_scaling.devices import StrategyInfo
from keras_scaling.internals import _probes

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "workers"))
import data_wrapping_sources as sources  # noqa: E402


@pytest.fixture(scope="module")
def files_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("wrapping"))
    sources.write_all(directory)
    return directory


@pytest.fixture(scope="module")
def strategy():
    # One per process: two MirroredStrategy objects clash in their all-reduce.
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _epoch_ids(dataset, name):
    """The ids of the real samples of one epoch, and the batch sizes seen."""
    ids_of = sources.SOURCES[name][1]
    ids, batch_sizes = [], []
    for x, y, weights in dataset.as_numpy_iterator():
        batch_sizes.append(len(y))
        real = weights > 0
        ids.extend(ids_of(x[real], y[real]))
    return ids, batch_sizes


def _worker(num_workers, worker_index):
    return StrategyInfo(
        kind="MultiWorkerMirroredStrategy",
        num_workers=num_workers,
        worker_index=worker_index,
        is_chief=worker_index == 0,
        num_replicas=2 * num_workers,
        local_devices=("/cpu:0", "/cpu:1"),
        device_kind="CPU",
    )


@pytest.mark.logical_cpus(2)
@pytest.mark.parametrize("name", list(sources.SOURCES))
def test_every_sample_once_per_epoch_in_global_batches_on_two_replicas(name, files_dir, strategy):
    source, kwargs = sources.make_source(name, files_dir)
    dataset = data.distribute(source, strategy=strategy, last_batch="pad", **kwargs)
    plan = data.plan_of(dataset)
    num_samples = sources.SOURCES[name][0]
    assert plan.num_examples == num_samples
    # The data's own batch is the per-replica batch: twice it per step.
    assert plan.global_batch_size == 2 * sources.SOURCE_BATCH_SIZE
    for _ in range(2):
        ids, batch_sizes = _epoch_ids(dataset, name)
        assert sorted(ids) == list(range(num_samples))
        assert set(batch_sizes) == {plan.global_batch_size}
        assert (
            len(batch_sizes)
            == plan.steps_per_epoch
            == math.ceil(num_samples / plan.global_batch_size)
        )


@pytest.mark.logical_cpus(2)
@pytest.mark.parametrize("name", list(sources.SOURCES))
def test_fit_trains_for_the_planned_steps_on_two_replicas(name, files_dir, strategy):
    source, kwargs = sources.make_source(name, files_dir)
    train = data.distribute(source, strategy=strategy, **kwargs)
    with strategy.scope():
        model = sources.make_model(name)
    counter = sources.CountSteps()
    history = model.fit(sources.for_fit(name, train), epochs=1, verbose=0, callbacks=[counter])
    assert counter.steps == data.plan_of(train).steps_per_epoch
    assert all(np.isfinite(history.history["loss"]))


@pytest.mark.parametrize("name", list(sources.SOURCES))
def test_two_workers_split_every_epoch_exactly_with_equal_steps(name, files_dir):
    num_samples = sources.SOURCES[name][0]
    readings = []
    for worker_index in range(2):
        source, kwargs = sources.make_source(name, files_dir)
        dataset = data._distribute_for(source, _worker(2, worker_index), last_batch="pad", **kwargs)
        readings.append((data.plan_of(dataset), _epoch_ids(dataset, name)))
    plans = [plan for plan, _ in readings]
    assert len({plan.steps_per_epoch for plan in plans}) == 1
    for plan, (ids, batch_sizes) in readings:
        assert set(batch_sizes) == {plan.global_batch_size}
        assert len(batch_sizes) * 2 == plan.steps_per_epoch
        assert len(ids) == plan.worker_examples
    shares = [set(ids) for _, (ids, _) in readings]
    assert not shares[0] & shares[1]
    assert sorted(shares[0] | shares[1]) == list(range(num_samples))


@pytest.mark.parametrize("name", ["image_dataset_from_directory", "text_dataset_from_directory"])
def test_directory_files_are_split_between_workers_before_decoding(name, files_dir):
    plans = [
        data.plan_of(
            data._distribute_for(sources.make_source(name, files_dir)[0], _worker(2, worker_index))
        )
        for worker_index in range(2)
    ]
    num_files = sources.SOURCES[name][0]
    assert [plan.shard_mode for plan in plans] == ["file", "file"]
    assert [plan.worker_files for plan in plans] == [num_files // 2] * 2
    assert any("before decoding" in note for note in plans[0].notes)
    assert any("replaced by the seeded shuffle" in note for note in plans[0].notes)


def test_unrecognised_directory_dataset_is_read_whole_with_one_warning(files_dir, caplog):
    _probes._warned.clear()
    images, _ = sources.make_source("image_dataset_from_directory", files_dir)
    relabelled = images.map(lambda x, y: (x, y + 1))
    relabelled.file_paths = images.file_paths
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        for worker_index in range(2):
            dataset = data._distribute_for(relabelled, _worker(2, worker_index))
    plan = data.plan_of(dataset)
    assert plan.shard_mode == "element" and plan.num_examples == sources.NUM_IMAGES
    warnings = [r for r in caplog.records if "cannot be split between workers" in r.message]
    assert len(warnings) == 1 and tf.__version__ in warnings[0].message


def test_without_the_directory_probe_files_are_decoded_by_every_worker(
    files_dir, caplog, monkeypatch
):
    images, _ = sources.make_source("image_dataset_from_directory", files_dir)
    _probes._warned.clear()
    monkeypatch.setenv(_probes.FAIL_PROBES_ENV, "tf.data.directory_pipeline")
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        plans = [
            data.plan_of(data._distribute_for(images, _worker(2, worker_index)))
            for worker_index in range(2)
        ]
    monkeypatch.delenv(_probes.FAIL_PROBES_ENV)
    _probes._warned.clear()
    assert [plan.shard_mode for plan in plans] == ["element", "element"]
    assert plans[0].num_examples == sources.NUM_IMAGES
    probe = _probes._registry["tf.data.directory_pipeline"]
    warnings = [r for r in caplog.records if probe.reaches in r.getMessage()]
    assert len(warnings) == 1 and probe.lost in warnings[0].getMessage()


def _shares_of_unseeded_image_datasets(directory, num_workers):
    """Each worker lists the files itself, in its own random order (no seed)."""
    shares = []
    for worker_index in range(num_workers):
        images = keras.utils.image_dataset_from_directory(
            directory, image_size=(4, 4), color_mode="grayscale", batch_size=4
        )
        dataset = data._distribute_for(images, _worker(num_workers, worker_index), last_batch="pad")
        shares.append(_epoch_ids(dataset, "image_dataset_from_directory")[0])
    return shares


def test_workers_agree_on_the_split_of_files_listed_in_random_orders(files_dir):
    shares = _shares_of_unseeded_image_datasets(os.path.join(files_dir, "images"), 2)
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(sources.NUM_IMAGES))


def test_fewer_files_than_workers_are_split_by_element_in_one_order(tmp_path):
    for index in range(2):
        folder = tmp_path / f"class_{index}"
        folder.mkdir()
        keras.utils.save_img(
            str(folder / f"{index}.png"), np.full((4, 4, 1), index, "uint8"), scale=False
        )
    shares = _shares_of_unseeded_image_datasets(str(tmp_path), 3)
    assert sorted(shares[0] + shares[1] + shares[2]) == [0, 1]


def test_directory_dataset_is_shuffled_anew_each_epoch_with_the_seed(files_dir):
    source, _ = sources.make_source("image_dataset_from_directory", files_dir)
    dataset = data.distribute(source, global_batch_size=8, last_batch="pad", seed=3)
    first, _ = _epoch_ids(dataset, "image_dataset_from_directory")
    second, _ = _epoch_ids(dataset, "image_dataset_from_directory")
    again = data.distribute(source, global_batch_size=8, last_batch="pad", seed=3)
    assert first != second
    assert _epoch_ids(again, "image_dataset_from_directory")[0] == first


def test_py_dataset_items_are_split_by_index_between_workers():
    plans = [
        data.plan_of(data._distribute_for(sources.TaggedItems(), _worker(2, index)))
        for index in range(2)
    ]
    assert [plan.shard_mode for plan in plans] == ["item", "item"]
    # Items 0, 2, 4, 6, 8 (the last holds 2) and 1, 3, 5, 7.
    assert [plan.worker_files for plan in plans] == [5, 4]
    assert plans[0].num_examples == 34


def test_py_dataset_epoch_hooks_are_called_once_per_epoch_by_fit():
    py_dataset = sources.TaggedItems(workers=2)
    train = data.distribute(py_dataset, global_batch_size=8)
    model = sources.make_model("py_dataset")
    model.fit(train, epochs=3, verbose=0)
    assert py_dataset.epochs_begun == 3
    assert py_dataset.epochs_ended == 3


def test_py_dataset_read_by_processes_gives_every_sample_once():
    py_dataset = sources.TaggedItems(workers=2, use_multiprocessing=True)
    dataset = data.distribute(py_dataset, global_batch_size=8, last_batch="pad")
    ids, _ = _epoch_ids(dataset, "py_dataset")
    assert sorted(ids) == list(range(sources.SOURCES["py_dataset"][0]))


def test_py_dataset_pass_given_up_early_does_not_end_the_epoch():
    # Far more items than the pipeline reads ahead (about 10 of these in a
    # probe), which can reach the end of a smaller dataset before the
    # peeking iterator is dropped.
    py_dataset = sources.TaggedItems(num_items=64)
    dataset = data.distribute(py_dataset, global_batch_size=8)
    next(iter(dataset))  # as a model build peeks at a first batch
    list(dataset)
    assert (py_dataset.epochs_begun, py_dataset.epochs_ended) == (1, 1)


def test_batch_size_given_overrides_the_datas_own_batch():
    batched = tf.data.Dataset.range(50).batch(4)
    plan = data.describe(batched, per_replica_batch_size=10)
    assert (plan.per_replica_batch_size, plan.steps_per_epoch) == (10, 5)
    assert not any("taken from the data's own batch" in note for note in plan.notes)


@pytest.mark.parametrize("cached", [False, True], ids=["prefetched", "cached"])
def test_batched_count_comes_from_the_elements_before_the_batch(cached):
    batched = tf.data.Dataset.range(50).map(lambda i: (i, i)).batch(8)
    batched = (batched.cache() if cached else batched).prefetch(2)
    plan = data.describe(batched)
    assert plan.num_examples == 50
    assert any("50 elements before .batch()" in note for note in plan.notes)


def test_unknown_length_is_counted_once_and_logged(caplog):
    caplog.set_level(logging.INFO, logger="keras_scaling")
    filtered = tf.data.Dataset.range(100).filter(lambda i: i % 3 == 0).batch(8)
    plan = data.describe(filtered)
    assert plan.num_examples == 34
    assert "Counted 34 samples" in caplog.text


def test_counting_time_is_estimated_from_the_pace_of_the_first_elements():
    from keras_scaling.data import _sources

    assert _sources.estimated_seconds(2.0, 1024, 10_240) == 18.0
    assert _sources.estimated_seconds(2.0, 1024, -2) is None  # unknown total


def test_num_samples_saves_the_count_of_a_generator():
    plan = data.describe(
        sources.generate_samples,
        global_batch_size=4,
        output_signature=sources.GENERATOR_SIGNATURE,
        num_samples=sources.NUM_GENERATED,
    )
    assert (plan.num_examples, plan.steps_per_epoch) == (40, 10)


# --- bad input -------------------------------------------------------------


class _Disagreeing(keras.utils.PyDataset):
    def __init__(self, bad_index):
        super().__init__()
        self.bad_index = bad_index

    def __len__(self):
        return 4

    def __getitem__(self, index):
        x = np.zeros((4, 3), "float32")
        if index == self.bad_index:
            return x  # no targets
        return x, np.zeros(4, "float32")


def test_py_dataset_whose_last_item_disagrees_is_refused_up_front():
    with pytest.raises(ValueError, match="PyDataset item 3 does not match item 0"):
        data.distribute(_Disagreeing(bad_index=3), global_batch_size=4)


def test_py_dataset_whose_middle_item_disagrees_fails_when_read():
    dataset = data.distribute(_Disagreeing(bad_index=1), global_batch_size=4)
    with pytest.raises(Exception, match="PyDataset item 1 does not match item 0"):
        list(dataset)


def test_num_samples_that_contradicts_the_files_is_refused(files_dir):
    source, _ = sources.make_source("image_dataset_from_directory", files_dir)
    with pytest.raises(
        ValueError, match="num_samples=41 contradicts the dataset's files, which holds 40"
    ):
        data.distribute(source, num_samples=41)


def test_num_samples_that_contradicts_a_py_dataset_is_refused():
    with pytest.raises(ValueError, match="num_samples=36 contradicts the PyDataset: 9 items"):
        data.distribute(sources.TaggedItems(), num_samples=36)


def test_num_samples_that_contradicts_a_generator_fails_when_read():
    dataset = data.distribute(
        sources.generate_samples,
        global_batch_size=4,
        last_batch="pad",
        output_signature=sources.GENERATOR_SIGNATURE,
        num_samples=50,
    )
    with pytest.raises(tf.errors.OpError, match="expected to contain 50 elements"):
        list(dataset)


def test_padded_batches_that_cannot_be_rebatched_are_refused():
    sequences = tf.data.Dataset.range(1, 9).map(lambda n: tf.range(n))
    with pytest.raises(ValueError, match=r"batched with \.padded_batch\(\).*cannot be re-batched"):
        data.distribute(sequences.padded_batch(4), global_batch_size=8)


def test_padded_batches_of_a_fixed_shape_are_rebatched():
    sequences = tf.data.Dataset.range(1, 9).map(lambda n: tf.range(n))
    padded = sequences.padded_batch(4, padded_shapes=[10])
    dataset = data.distribute(padded, global_batch_size=8)
    assert dataset.element_spec.shape.as_list() == [8, 10]


def test_generator_object_is_refused_with_the_fix():
    with pytest.raises(TypeError, match="Pass the generator function itself"):
        data.distribute(sources.generate_samples(), global_batch_size=4, num_samples=40)


def test_output_signature_without_a_generator_function_is_refused():
    with pytest.raises(TypeError, match="output_signature is for a generator function"):
        data.distribute(
            np.arange(4), global_batch_size=2, output_signature=tf.TensorSpec([], tf.int64)
        )


def test_num_samples_must_be_a_positive_integer():
    with pytest.raises(ValueError, match="num_samples must be a positive integer, got 0"):
        data.distribute(np.arange(4), global_batch_size=2, num_samples=0)
