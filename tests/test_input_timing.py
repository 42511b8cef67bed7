"""The input timing of ThroughputLogger's advice changes nothing training reads.

A dataset of `keras_scaling.data.distribute` shuffles with
`reshuffle_each_iteration=True`: each iterator draws the next order. The
timing reads a pipeline of its own, so the orders training draws are those of
a run without it.
"""

import numpy as np
import tensorflow as tf

import keras_scaling
from keras_scaling.throughput import _input_timing


def _shuffled(seed=3):
    x = np.arange(64, dtype="float32")[:, None]
    return keras_scaling.data.distribute((x, x), global_batch_size=8, shuffle=True, seed=seed)


def _epoch_orders(dataset, epochs, timed_in_epoch=None):
    orders = []
    for epoch in range(epochs):
        iterator = iter(dataset)
        order = []
        for step, (x, _) in enumerate(iterator):
            if epoch == timed_in_epoch and step == 2:
                samples_per_sec, reason = _input_timing.input_samples_per_sec(iterator)
                assert samples_per_sec is not None, reason
            order.extend(int(value) for value in x.numpy()[:, 0])
        orders.append(order)
    return orders


def test_timing_a_distribute_dataset_leaves_its_later_orders_unchanged():
    untimed = _epoch_orders(_shuffled(), epochs=3)
    timed = _epoch_orders(_shuffled(), epochs=3, timed_in_epoch=1)

    assert timed == untimed
    assert untimed[1] != untimed[2]  # the data does reshuffle


def test_a_dataset_that_shuffles_by_itself_is_not_read_by_the_timing():
    dataset = tf.data.Dataset.range(64).shuffle(64, seed=1).batch(8)
    iterator = iter(dataset)
    next(iterator)

    samples_per_sec, reason = _input_timing.input_samples_per_sec(iterator)

    assert samples_per_sec is None
    assert "shuffles" in reason


def test_a_dataset_without_shared_state_is_timed():
    dataset = tf.data.Dataset.range(640).map(lambda i: tf.cast(i, tf.float32)).batch(8)

    samples_per_sec, reason = _input_timing.input_samples_per_sec(iter(dataset))

    assert reason is None and samples_per_sec > 0
