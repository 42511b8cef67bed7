"""Keras' epochs number the passes of a `distribute` dataset, and fit does not warn about its shuffle."""

import os
import warnings

import keras
import numpy as np
import tensorflow as tf

from keras_scaling import data

KERAS_SHUFFLE_WARNING = "`shuffle=True` was passed, but will be ignored"


def _trained_ids(train, epochs=2):
    """The sample ids `fit` trains on, batch by batch, over `epochs` epochs."""
    seen = []

    class Record(keras.layers.Layer):
        def call(self, inputs, training=None):
            if training and tf.executing_eagerly():
                seen.append(inputs[:, 0].numpy().astype(int).tolist())
            return inputs

    model = keras.Sequential([keras.Input((1,)), Record(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    model.fit(train, epochs=epochs, verbose=0)
    return seen


def _ids_dataset(**kwargs):
    x = np.arange(64, dtype="float32")[:, None]
    return data.distribute((x, x), global_batch_size=8, **kwargs)


def test_a_look_at_batches_before_fit_changes_no_order_fit_reads():
    untouched = _trained_ids(_ids_dataset())
    looked_at = _ids_dataset()
    next(iter(looked_at))
    list(looked_at.take(2))
    for _ in looked_at:
        pass
    assert _trained_ids(looked_at) == untouched


def test_each_epoch_of_fit_reads_a_new_order_of_every_sample():
    batches = _trained_ids(_ids_dataset())
    first, second = sum(batches[:8], []), sum(batches[8:], [])
    assert sorted(first) == sorted(second) == list(range(64))
    assert first != second


def test_a_dataset_made_from_the_pipeline_is_numbered_by_keras_too():
    untouched = _trained_ids(_ids_dataset())
    looked_at = _ids_dataset()
    next(iter(looked_at))
    assert _trained_ids(looked_at.map(lambda x, y: (x, y))) == untouched


def _warnings_of_fit(train, **fit_kwargs):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(train, epochs=1, verbose=0, **fit_kwargs)
    return [warning for warning in caught if KERAS_SHUFFLE_WARNING in str(warning.message)]


def test_fit_on_shuffled_distribute_data_does_not_warn_that_shuffle_is_ignored():
    assert not _warnings_of_fit(_ids_dataset())


def test_fit_still_warns_from_keras_for_a_dataset_nobody_shuffles():
    x = np.arange(64, dtype="float32")[:, None]
    plain = tf.data.Dataset.from_tensor_slices((x, x)).batch(8)
    for dataset in (plain, _ids_dataset(shuffle=False)):
        (warning,) = _warnings_of_fit(dataset)
        # Where Keras' warning says it comes from: Keras' own code.
        assert os.path.basename(warning.filename) == "epoch_iterator.py"
