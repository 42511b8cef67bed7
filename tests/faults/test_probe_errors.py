"""Fault: a bug inside a guarded reach surfaces; a private name that moved still degrades.

A probe's guard catches only what a release that moved or reshaped a private
name raises (`_probes.REACH_ERRORS`: a missing attribute, module or key, a
changed signature, a failed shape check). Any other error inside a guarded
body is a bug of keras_scaling's own: it must reach the caller, without a
"Keras changed" warning and without turning the feature off. The faults are
injected into the package's real probes, through the private names they read.
"""

import logging

import pytest
import tensorflow as tf

from keras_scaling import data
from keras_scaling.internals import _probes, _tf_data, _versions


@pytest.fixture(autouse=True)
def fresh_warnings():
    _probes._warned.clear()
    yield
    _probes._warned.clear()


def _warnings_of(probe_name, caplog):
    probe = _probes._registry[probe_name]
    return [
        record.getMessage()
        for record in caplog.records
        if probe.reaches in record.getMessage()
        and probe.lost in record.getMessage()
        and probe.workaround in record.getMessage()
        and f"Keras {_versions.keras_version()}" in record.getMessage()
    ]


class _Iterator:
    """An iterator whose private `_dataset` raises `error` when read."""

    def __init__(self, error):
        self._error = error

    @property
    def _dataset(self):
        raise self._error


@pytest.mark.parametrize(
    "bug", [ZeroDivisionError("division by zero"), ValueError("bad count"), IndexError("index")]
)
def test_a_bug_inside_a_real_probe_surfaces_and_turns_nothing_off(bug, caplog):
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        with pytest.raises(type(bug), match=str(bug)):
            _tf_data.dataset_of_iterator(_Iterator(bug))

    assert _warnings_of("tf.distribute.iterator_dataset", caplog) == []
    assert "tf.distribute.iterator_dataset" not in _probes._warned
    dataset = tf.data.Dataset.range(3)
    assert _tf_data.dataset_of_iterator(iter(dataset)) is dataset  # still on


def test_a_private_name_that_moved_degrades_to_unknown_with_one_warning(caplog):
    moved = _Iterator(AttributeError("'OwnedIterator' object has no attribute '_dataset'"))
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        assert _tf_data.dataset_of_iterator(moved) is None
        assert _tf_data.dataset_of_iterator(moved) is None

    (warning,) = _warnings_of("tf.distribute.iterator_dataset", caplog)
    assert "AttributeError: 'OwnedIterator' object has no attribute '_dataset'" in warning


def _batched_with_inputs_raising(error):
    """`range(50).batch(8).map(...)`, whose batch's private `_inputs()` raises `error`."""
    batched = tf.data.Dataset.range(50).batch(8)

    def inputs():
        raise error

    batched._inputs = inputs
    return batched.map(lambda batch: batch)


def test_a_bug_in_the_dataset_walk_surfaces_from_describe(caplog):
    batched = _batched_with_inputs_raising(ValueError("a bug in the walk"))
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        with pytest.raises(ValueError, match="a bug in the walk"):
            data.describe(batched, per_replica_batch_size=5)
    assert _warnings_of("tf.data.batching_transformation", caplog) == []


def test_a_dataset_walk_that_meets_a_moved_name_reads_batches_as_samples_once_warned(caplog):
    assert (
        data.describe(tf.data.Dataset.range(50).batch(8), per_replica_batch_size=5).num_examples
        == 50
    )

    moved = AttributeError("'_RangeDataset' object has no attribute '_inputs'")
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        plan = data.describe(_batched_with_inputs_raising(moved), per_replica_batch_size=5)
        data.describe(_batched_with_inputs_raising(moved), per_replica_batch_size=5)

    assert plan.num_examples == 7  # its 7 batches, each taken as one sample
    assert len(_warnings_of("tf.data.batching_transformation", caplog)) == 1
