"""Fix for tensorflow/tensorflow#72388: scalars are averaged with `axis=None`, not `axis=0`."""

import keras

from keras_scaling.compat import _keras_source, _keras_trainer
from keras_scaling.devices import _topology

NAME = "scalar_reduce"
ISSUE = "tensorflow/tensorflow#72388"
SUMMARY = (
    "scalar metrics fail to reduce under MultiWorkerMirroredStrategy; scalars "
    "are averaged over replicas with axis=None"
)


def target():
    return _keras_trainer.trainer_module(), "reduce_per_replica"


def probe():
    """Whether the installed Keras reduces scalars with `axis=0`."""
    if _keras_trainer.trainer_module() is None:
        return False, _keras_source.TRAINER_NOT_FOUND
    reduce_per_replica = _keras_trainer.module_function("reduce_per_replica")
    if reduce_per_replica is None:
        return False, "keras' reduce_per_replica is gone"
    source = _keras_source.source_of(reduce_per_replica)
    if source is None:
        return _keras_source.by_version("the axis=0 reduction of scalars")
    axis_0 = r"strategy\.reduce\(\s*[\"']MEAN[\"']\s*,\s*v\s*,\s*axis=0\s*\)"
    if _keras_source.contains(axis_0, source):
        return True, "reduce_per_replica averages every output with axis=0, scalars included"
    return False, "reduce_per_replica no longer averages with axis=0"


def make_replacement(original_reduce_per_replica):

    def reduce_per_replica(values, strategy, reduction):
        multi_worker = _keras_trainer.is_multi_worker_collective(strategy)
        if reduction not in ("auto", "mean") or not multi_worker:
            return original_reduce_per_replica(values, strategy, reduction)

        def reduce_one(value):
            if _topology.local_copy(value, strategy).shape.rank == 0:
                return strategy.reduce("MEAN", value, axis=None)
            return original_reduce_per_replica(value, strategy, reduction)

        return keras.tree.map_structure(reduce_one, values)

    return reduce_per_replica
