"""Fix: a whole epoch on every worker for datasets TensorFlow does not shard.

Keras takes the steps of an epoch from the dataset's cardinality
(`TFDatasetAdapter.num_batches`). Under `MultiWorkerMirroredStrategy`,
`experimental_distribute_dataset` cuts every batch of a worker's dataset into
pieces for all replicas of all workers, and each step feeds this worker's
replicas with `num_replicas_in_sync / num_workers` of them. With TensorFlow's
sharding on (`AutoShardPolicy` AUTO, DATA or FILE) each worker then keeps
only `1 / num_workers` of the pieces or of the files, and an epoch is the
cardinality, as Keras counts. With `AutoShardPolicy.OFF` (a dataset that is
already this worker's share: what `keras_scaling.data.distribute` returns,
or one a user sharded himself) every piece is used: one batch lasts
`num_workers` steps, and Keras stops `fit`, `evaluate` and `predict` after
`1 / num_workers` of the data, then starts the next epoch on a new iterator,
so the rest of each worker's share is never read.

The replacement `TFEpochIterator.__init__` gives exactly those iterators
(multi-worker strategy, a `tf.data.Dataset` that Keras distributes itself,
sharding off) an adapter whose `num_batches` is `num_workers` times the
cardinality (`EpochIterator.reset()` reads it again every epoch); a dataset
of unknown or infinite length keeps `None`. Every other iterator, and
everything else about these, is left as Keras makes it.
"""

import functools

import tensorflow as tf

from keras_scaling.compat import _keras_source, _keras_trainer
from keras_scaling.devices import _topology

NAME = "multi_worker_epoch"
ISSUE = "no upstream issue"
SUMMARY = (
    "under MultiWorkerMirroredStrategy, fit, evaluate and predict run "
    "1/num_workers of an epoch of a dataset with AutoShardPolicy.OFF; the "
    "epoch counts num_workers steps per batch of each worker"
)


def target():
    """The attribute this fix replaces: `(owner, name)`."""
    return _keras_trainer.module_function("TFEpochIterator"), "__init__"


def probe():
    """Whether Keras counts one step per batch of each worker's dataset."""
    adapter = _keras_trainer.dataset_adapter_class()
    if _keras_trainer.trainer_module() is None or adapter is None:
        return False, _keras_source.TRAINER_NOT_FOUND
    iterator = _keras_trainer.module_function("TFEpochIterator")
    if not isinstance(iterator, type) or "__init__" not in iterator.__dict__:
        return False, (
            "TFEpochIterator.__init__ is gone: the iterator this fix adjusts no longer exists"
        )
    num_batches = adapter.__dict__.get("num_batches")
    sources = [
        _keras_source.source_of(getattr(num_batches, "fget", None)),
        _keras_source.source_of(iterator.__dict__["__init__"]),
    ]
    if None in sources:
        return _keras_source.by_version(
            "the epoch of one step per batch of each worker's dataset",
            upstream_issue_open=False,
        )
    num_batches_source, init_source = sources
    if _keras_source.contains(r"auto_shard|num_workers", num_batches_source + init_source):
        return False, (
            "Keras now looks at sharding or workers when it counts the steps of a tf.data.Dataset"
        )
    if _keras_source.contains(r"cardinality", num_batches_source):
        return True, (
            "TFDatasetAdapter.num_batches is the dataset's cardinality, one "
            "step per batch, whatever the workers and the sharding"
        )
    return False, "TFDatasetAdapter.num_batches no longer reads the cardinality"


def steps_per_batch(strategy, dataset):
    """How many steps one batch of `dataset` lasts when Keras distributes it.

    `num_workers` under a multi-worker strategy when TensorFlow's sharding is
    off: every worker keeps all of its batches and each step uses
    `1 / num_workers` of one. Otherwise 1.

    Args:
        strategy: the `tf.distribute.Strategy` of the model.
        dataset: the `tf.data.Dataset` of batches given to Keras.

    Returns:
        int.
    """
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or not isinstance(
        dataset, tf.data.Dataset
    ):
        return 1
    workers = _topology.num_workers(strategy)
    if workers < 2:
        return 1
    policy = dataset.options().experimental_distribute.auto_shard_policy
    if policy != tf.data.experimental.AutoShardPolicy.OFF:
        return 1
    return workers


@functools.cache
def _worker_share_adapter_class(keras_adapter_class):
    """A subclass of Keras' dataset adapter whose epoch lasts the steps it takes."""

    class _WorkerShareAdapter(keras_adapter_class):  # type: ignore[valid-type, misc]
        """Keras' adapter of a worker's dataset, with the epoch in steps it lasts."""

        def __init__(self, adapter, steps_per_batch):
            # The same state as the adapter Keras made; only the count differs.
            self.__dict__.update(vars(adapter))
            self._steps_per_batch = steps_per_batch

        @property
        def num_batches(self):
            batches = super().num_batches
            return None if batches is None else batches * self._steps_per_batch

    return _WorkerShareAdapter


def make_replacement(original_init):
    """Returns a `TFEpochIterator.__init__` that counts whole epochs."""

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        adapter = self.data_adapter
        keras_adapter_class = _keras_trainer.dataset_adapter_class()
        if type(adapter) is not keras_adapter_class:
            return
        factor = steps_per_batch(
            getattr(self, "_distribute_strategy", None), adapter.get_tf_dataset()
        )
        if factor > 1:
            self.data_adapter = _worker_share_adapter_class(keras_adapter_class)(  # type: ignore[arg-type]
                adapter, factor
            )
            self._num_batches = self.data_adapter.num_batches

    return __init__
