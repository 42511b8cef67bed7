"""Fix: under `MultiWorkerMirroredStrategy` a batch of a dataset with `AutoShardPolicy.OFF` lasts
`num_workers` steps, so its epoch is `num_workers` times the cardinality, not the cardinality."""

import functools

import tensorflow as tf

from keras_scaling.compat import _keras_source, _keras_trainer
from keras_scaling.devices import _topology

NAME = "multi_worker_epoch"
ISSUE = "no upstream issue"
SUMMARY = (
    "under MultiWorkerMirroredStrategy, fit, evaluate and predict run 1/num_workers "
    "of an epoch of a dataset with AutoShardPolicy.OFF; the epoch counts "
    "num_workers steps per batch"
)


def target():
    return _keras_trainer.module_function("TFEpochIterator"), "__init__"


def probe():
    """Whether Keras counts one step per batch of each worker's dataset."""
    adapter = _keras_trainer.dataset_adapter_class()
    if _keras_trainer.trainer_module() is None or adapter is None:
        return False, _keras_source.TRAINER_NOT_FOUND
    iterator = _keras_trainer.module_function("TFEpochIterator")
    if not isinstance(iterator, type) or "__init__" not in iterator.__dict__:
        return False, "TFEpochIterator.__init__ is gone"
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
        return False, "Keras now counts a dataset's steps by its sharding or workers"
    if _keras_source.contains(r"cardinality", num_batches_source):
        return True, "TFDatasetAdapter.num_batches is the cardinality, whatever the sharding"
    return False, "TFDatasetAdapter.num_batches no longer reads the cardinality"


def steps_per_batch(strategy, dataset):
    """The steps one batch lasts: `num_workers` for a multi-worker strategy with sharding off, else 1."""
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    if not multi_worker or not isinstance(dataset, tf.data.Dataset):
        return 1
    policy = dataset.options().experimental_distribute.auto_shard_policy
    if policy != tf.data.experimental.AutoShardPolicy.OFF:
        return 1
    return _topology.num_workers(strategy)


@functools.cache
def _worker_share_adapter_class(keras_adapter_class):

    class _WorkerShareAdapter(keras_adapter_class):  # type: ignore[valid-type, misc]
        def __init__(self, adapter, steps_per_batch):
            self.__dict__.update(vars(adapter))
            self._steps_per_batch = steps_per_batch

        @property
        def num_batches(self):
            batches = super().num_batches
            return None if batches is None else batches * self._steps_per_batch

    return _WorkerShareAdapter


def make_replacement(original_init):

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        adapter = self.data_adapter
        keras_adapter_class = _keras_trainer.dataset_adapter_class()
        if type(adapter) is not keras_adapter_class:
            return
        strategy = getattr(self, "_distribute_strategy", None)
        factor = steps_per_batch(strategy, adapter.get_tf_dataset())
        if factor > 1:
            adapter_class = _worker_share_adapter_class(keras_adapter_class)  # type: ignore[arg-type]
            self.data_adapter = adapter_class(adapter, factor)
            self._num_batches = self.data_adapter.num_batches

    return __init__
