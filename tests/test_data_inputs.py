"""What distribute() accepts and how it refuses the rest (one replica)."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from keras_scaling import data


def _ids(dataset):
    """The first component of every element, batch after batch."""
    return [
        batch[0].tolist() if isinstance(batch, tuple) else batch.tolist()
        for batch in dataset.as_numpy_iterator()
    ]


def _write_records(path, values):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for value in values:
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))}
                )
            )
            writer.write(example.SerializeToString())
    return str(path)


def _parse(record):
    features = tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64)})
    return features["id"], features["id"] * 2


def test_arrays_in_fit_layout_give_batches_with_the_same_layout():
    x = np.arange(10, dtype="float32")
    dataset = data.distribute((x, x * 2, np.ones(10)), global_batch_size=4, shuffle=False)
    first = next(dataset.as_numpy_iterator())
    assert [part.tolist() for part in first] == [[0, 1, 2, 3], [0, 2, 4, 6], [1, 1, 1, 1]]


def test_dict_inputs_keep_their_keys():
    x = {"a": np.arange(6), "b": np.arange(6) * 10}
    dataset = data.distribute((x, np.arange(6)), global_batch_size=3, shuffle=False)
    first_x, first_y = next(dataset.as_numpy_iterator())
    assert first_x["b"].tolist() == [0, 10, 20] and first_y.tolist() == [0, 1, 2]


def test_trailing_none_is_ignored_as_fit_does():
    dataset = data.distribute(
        (np.arange(4), np.arange(4), None), global_batch_size=2, shuffle=False
    )
    assert len(dataset.element_spec) == 2


def test_a_dataset_keeps_its_order_by_default_and_is_parsed_after_batching_plan():
    source = tf.data.Dataset.range(10)
    dataset = data.distribute(source, global_batch_size=5, parse_fn=lambda i: (i, -i))
    assert _ids(dataset) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert data.plan_of(dataset).shuffle is False


def test_arrays_are_shuffled_by_default_with_a_fixed_seed():
    plan = data.describe(np.arange(10), global_batch_size=5)
    assert plan.shuffle is True and plan.seed == data.DEFAULT_SEED


def _samples(dataset):
    return sorted(sample for batch in _ids(dataset) for sample in batch)


@pytest.mark.parametrize(
    "make_source",
    [
        pytest.param(lambda: np.arange(40), id="arrays"),
        pytest.param(lambda: tf.data.Dataset.range(40), id="dataset"),
    ],
)
def test_an_iterator_made_and_never_read_changes_no_order(make_source):
    undisturbed = data.distribute(make_source(), global_batch_size=8, shuffle=True)
    disturbed = data.distribute(make_source(), global_batch_size=8, shuffle=True)
    expected = [_ids(undisturbed) for _ in range(3)]

    orders = [_ids(disturbed)]
    iter(disturbed)  # made and dropped unread, as Keras does at each epoch's end
    iter(disturbed)
    orders += [_ids(disturbed), _ids(disturbed)]

    assert orders == expected
    assert expected[0] != expected[1] != expected[2]
    assert all(_samples(disturbed) == list(range(40)) for _ in range(2))


def test_the_order_is_the_seeds_whatever_tensorflows_global_seed():
    orders = []
    try:
        for global_seed in (0, 7):
            tf.random.set_seed(global_seed)
            dataset = data.distribute(tf.data.Dataset.range(40), global_batch_size=8, shuffle=True)
            orders.append([_ids(dataset), _ids(dataset)])
    finally:
        tf.random.set_seed(None)

    assert orders[0] == orders[1]
    other_seed = data.distribute(
        tf.data.Dataset.range(40), global_batch_size=8, shuffle=True, seed=5
    )
    assert _ids(other_seed) != orders[0][0]


def test_pad_with_x_only_adds_rows_but_no_weights():
    dataset = data.distribute(np.arange(5), global_batch_size=4, last_batch="pad", shuffle=False)
    assert _ids(dataset) == [[0, 1, 2, 3], [4, 0, 0, 0]]


def test_pad_multiplies_given_sample_weights():
    x = np.arange(5, dtype="float32")
    weights = np.full(5, 3.0, dtype="float32")
    dataset = data.distribute((x, x, weights), global_batch_size=4, last_batch="pad", shuffle=False)
    last = list(dataset.as_numpy_iterator())[-1]
    assert last[2].tolist() == [3.0, 0.0, 0.0, 0.0]


def test_tfrecord_files_are_parsed_once_each(tmp_path):
    paths = [
        _write_records(tmp_path / "a.tfrecord", range(0, 7)),
        _write_records(tmp_path / "b.tfrecord", range(7, 12)),
    ]
    dataset = data.distribute(paths, global_batch_size=4, last_batch="pad", parse_fn=_parse)
    plan = data.plan_of(dataset)
    assert (plan.num_examples, plan.num_files, plan.steps_per_epoch) == (12, 2, 3)
    batches = list(dataset.as_numpy_iterator())
    ids = [int(i) for x, _, w in batches for i, wi in zip(x, w) if wi == 1]
    assert sorted(ids) == list(range(12))


def test_describe_of_a_distributed_dataset_is_its_plan():
    dataset = data.distribute(np.arange(8), global_batch_size=4)
    assert data.describe(dataset) is data.plan_of(dataset)
    assert data.plan_of(tf.data.Dataset.range(3)) is None


def test_distribute_logs_the_plan_once(caplog):
    caplog.set_level(logging.INFO, logger="keras_scaling")
    data.distribute(np.arange(8), global_batch_size=4)
    assert caplog.text.count("Input plan") == 1


def test_global_batch_size_multiplies_by_the_replicas():
    assert data.global_batch_size(32) == 32


def test_the_result_is_not_sharded_again_by_tensorflow():
    dataset = data.distribute(np.arange(8), global_batch_size=4)
    policy = dataset.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.OFF


def test_the_result_ends_with_prefetch():
    dataset = data.distribute(np.arange(8), global_batch_size=4)
    assert type(dataset).__name__ == "_PrefetchDataset"


@pytest.mark.parametrize(
    "batched",
    [
        lambda d: d.batch(4),
        lambda d: d.batch(4, drop_remainder=True).map(lambda x: x + 1),
        lambda d: d.padded_batch(4),
        lambda d: d.batch(2).prefetch(1),
    ],
)
def test_already_batched_dataset_is_rebatched_to_the_global_batch(batched):
    dataset = data.distribute(batched(tf.data.Dataset.range(8)), global_batch_size=4)
    assert [len(batch) for batch in _ids(dataset)] == [4, 4]


def test_batch_then_unbatch_is_accepted():
    dataset = tf.data.Dataset.range(8).batch(4).unbatch()
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(8))
    assert data.describe(dataset, global_batch_size=4).num_examples == 8


def test_images_are_not_mistaken_for_batches():
    images = tf.data.Dataset.from_tensor_slices(np.zeros((6, 4, 4, 3), "float32"))
    assert data.describe(images, global_batch_size=3).steps_per_epoch == 2


def test_unknown_cardinality_is_counted_or_declared():
    filtered = tf.data.Dataset.range(10).filter(lambda x: x % 2 == 0)
    assert data.describe(filtered, global_batch_size=2).num_examples == 5
    declared = filtered.apply(tf.data.experimental.assert_cardinality(5))
    assert data.describe(declared, global_batch_size=2).num_examples == 5


def test_infinite_dataset_is_refused():
    with pytest.raises(ValueError, match=r"infinite dataset \(.repeat\(\)"):
        data.distribute(tf.data.Dataset.range(4).repeat(), global_batch_size=2)


@pytest.mark.parametrize(
    "empty",
    [tf.data.Dataset.range(0), np.zeros((0, 3)), (np.zeros((0, 3)), np.zeros(0))],
)
def test_empty_data_is_refused(empty):
    with pytest.raises(ValueError, match="empty"):
        data.distribute(empty, global_batch_size=2)


def test_arrays_of_different_lengths_name_each_length():
    with pytest.raises(ValueError, match="x has 10, y has 9"):
        data.distribute((np.zeros(10), np.zeros(9)), global_batch_size=2)


def test_files_without_parse_fn_ask_for_it(tmp_path):
    path = _write_records(tmp_path / "a.tfrecord", range(3))
    with pytest.raises(ValueError, match="needs parse_fn"):
        data.distribute([path], global_batch_size=2)


def test_missing_files_are_named(tmp_path):
    present = _write_records(tmp_path / "a.tfrecord", range(3))
    missing = str(tmp_path / "nope.tfrecord")
    with pytest.raises(ValueError, match="1 file\\(s\\) that do not exist: .*nope.tfrecord"):
        data.distribute([present, missing], global_batch_size=2, parse_fn=_parse)


def test_parse_fn_must_be_callable():
    with pytest.raises(TypeError, match="parse_fn must be a function"):
        data.distribute(np.arange(4), global_batch_size=2, parse_fn="json")


def test_strategy_must_be_a_strategy():
    with pytest.raises(TypeError, match="strategy must be a tf.distribute.Strategy.*auto_strategy"):
        data.distribute(np.arange(4), global_batch_size=2, strategy="mirrored")


def test_unknown_last_batch_is_refused():
    with pytest.raises(ValueError, match="last_batch must be one of"):
        data.distribute(np.arange(4), global_batch_size=2, last_batch="keep")


def test_unknown_shard_is_refused():
    with pytest.raises(ValueError, match="shard must be one of"):
        data.distribute(np.arange(4), global_batch_size=2, shard="data")


def test_shard_by_file_needs_files():
    with pytest.raises(ValueError, match="shard='file' needs a list of TFRecord files"):
        data.distribute(np.arange(4), global_batch_size=2, shard="file")


def test_non_integer_batch_size_is_refused():
    with pytest.raises(
        TypeError, match="global_batch_size must be a positive integer, got float 2.5"
    ):
        data.distribute(np.arange(4), global_batch_size=2.5)


def test_unsupported_data_type_lists_what_is_accepted():
    with pytest.raises(TypeError, match="must be a tf.data.Dataset, a list of TFRecord"):
        data.distribute(object(), global_batch_size=2)


def test_several_inputs_as_a_list_stay_separate_and_fit_trains():
    import keras

    x1, x2 = np.ones((20, 3), "float32"), np.ones((20, 2), "float32")
    dataset = data.distribute(([x1, x2], np.ones((20, 1), "float32")), global_batch_size=5)
    inputs_spec = dataset.element_spec[0]
    assert [spec.shape.as_list() for spec in inputs_spec] == [[5, 3], [5, 2]]
    first, second = keras.Input((3,)), keras.Input((2,))
    output = keras.layers.Dense(1)(keras.layers.Concatenate()([first, second]))
    model = keras.Model([first, second], output)
    model.compile(optimizer="sgd", loss="mse")
    assert len(model.fit(dataset, verbose=0).history["loss"]) == 1


@pytest.mark.parametrize(
    "argument, value, message",
    [
        ("shuffle", "yes", "shuffle must be True, False or None"),
        ("seed", 1.5, "seed must be an integer or None"),
        ("cache", 1, "cache must be False, True"),
    ],
)
def test_other_bad_arguments_are_named(argument, value, message):
    with pytest.raises(TypeError, match=message):
        data.distribute(np.arange(4), global_batch_size=2, **{argument: value})


@pytest.mark.parametrize("last_batch", ["drop", "pad"])
def test_unshuffled_arrays_cache_their_batches_in_the_first_epoch(tmp_path, last_batch):
    rows = np.arange(11)
    kwargs = {"global_batch_size": 5, "shuffle": False, "last_batch": last_batch}
    plain = _ids(data.distribute(rows, **kwargs))
    cached = data.distribute(rows, cache=tmp_path / "c", **kwargs)
    assert _ids(cached) == plain
    assert list(tmp_path.glob("c.*"))
    assert _ids(cached) == plain


def test_shuffled_arrays_are_reshuffled_every_epoch_and_nothing_is_cached(tmp_path):
    rows = np.arange(40)
    plain = data.distribute(rows, global_batch_size=8, seed=3)
    cached = data.distribute(rows, global_batch_size=8, seed=3, cache=tmp_path / "c")
    epochs = [_ids(plain), _ids(plain)]
    assert epochs[0] != epochs[1]
    assert [_ids(cached), _ids(cached)] == epochs
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("last_batch", ["drop", "pad"])
def test_a_cache_file_path_is_written_in_the_first_epoch_and_read_back(tmp_path, last_batch):
    source = tf.data.Dataset.range(11)  # one sample dropped or padded
    dataset = data.distribute(
        source, global_batch_size=5, last_batch=last_batch, cache=tmp_path / "c"
    )
    assert _ids(dataset)[:2] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    # tf.data keeps a cache file only when the pass reads it to the end.
    assert list(tmp_path.glob("c.*"))
    assert _ids(dataset)[:2] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
