"""Fix for `fit` failing before the first step on several replicas.

Keras builds the model from the first batch averaged over the replicas with
`strategy.reduce("MEAN", ...)`: a multi-worker strategy rejects it
(keras-team/keras#20585), and on any strategy the mean (`AddN`) has no
kernel for `bool` and `string` inputs. Building needs only shapes and
dtypes: the replacement uses this worker's first replica's batch.
"""

import keras
import tensorflow as tf

from keras_scaling.compat import _keras_source, _keras_trainer
from keras_scaling.devices import _topology

NAME = "symbolic_build"
ISSUE = "keras-team/keras#20585"
SUMMARY = (
    "fit on several replicas fails before the first step under "
    "MultiWorkerMirroredStrategy, and with bool or string inputs; the model "
    "is built from one local replica's batch"
)


def target():
    return _keras_trainer.trainer_class(), "_maybe_symbolic_build"


def probe():
    """Whether the installed Keras reduces the first batch across replicas."""
    trainer = _keras_trainer.trainer_class()
    if trainer is None:
        return False, _keras_source.TRAINER_NOT_FOUND
    build = trainer.__dict__.get("_maybe_symbolic_build")
    if build is None:
        return False, f"{trainer.__name__}._maybe_symbolic_build is gone"
    source = _keras_source.source_of(build)
    if source is None:
        return _keras_source.by_version("the reduced first batch")
    if _keras_source.contains(r"strategy\.reduce\(\s*[\"']MEAN[\"']", source):
        return True, (
            f"{trainer.__name__}._maybe_symbolic_build averages the first batch "
            "with strategy.reduce, which MultiWorkerMirroredStrategy rejects and "
            "which fails on bool and string inputs"
        )
    return False, (
        f"{trainer.__name__}._maybe_symbolic_build no longer reduces the first "
        "batch across replicas"
    )


def _local_batch(batch, strategy):
    return keras.tree.map_structure(
        lambda value: (
            _topology.local_copy(value, strategy)
            if isinstance(value, tf.distribute.DistributedValues)
            else value
        ),
        batch,
    )


def make_replacement(original_build):

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if iterator is None or strategy is None:
            return original_build(self, iterator=iterator, data_batch=data_batch)
        # Keras 3.12 and later yield (begin_step, end_step, iterator), earlier (step, iterator).
        for item in iterator:
            data_batch = _local_batch(next(item[-1]), strategy)
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    return _maybe_symbolic_build
