"""auto_strategy's all-reduce across workers: named, checked, and built as TensorFlow's CommunicationOptions."""

import pytest
import tensorflow as tf

import keras_scaling
from keras_scaling.devices import strategies


def test_ring_and_a_pack_size_become_communication_options():
    options = strategies._communication_options("ring", 4 * 2**20)
    assert options.implementation == tf.distribute.experimental.CommunicationImplementation.RING
    assert options.bytes_per_pack == 4 * 2**20


def test_no_choice_leaves_tensorflow_its_own():
    assert strategies._communication_options(None, None) is None
    assert strategies._communication_options(None, 0) is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"communication": "mpi"}, "communication must be one of auto, ring, nccl"),
        ({"bytes_per_pack": -1}, "bytes_per_pack must be an integer >= 0"),
        ({"bytes_per_pack": 1.5}, "bytes_per_pack must be an integer >= 0"),
    ],
)
def test_bad_communication_options_are_refused_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        keras_scaling.auto_strategy(**kwargs)


def test_one_machine_ignores_the_options_across_workers():
    strategy = keras_scaling.auto_strategy(communication="ring", bytes_per_pack=1024)
    assert strategy.num_replicas_in_sync == 1
