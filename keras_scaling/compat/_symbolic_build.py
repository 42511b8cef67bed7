"""Fix for keras-team/keras#20585 (and `AddN` with no `bool` or `string` kernel): the model is
built from this worker's first replica's batch, not from its mean over the replicas."""

import keras

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
    name = f"{trainer.__name__}._maybe_symbolic_build"
    if "_maybe_symbolic_build" not in trainer.__dict__:
        return False, f"{name} is gone"
    source = _keras_source.source_of(trainer.__dict__["_maybe_symbolic_build"])
    if source is None:
        return _keras_source.by_version("the reduced first batch")
    if _keras_source.contains(r"strategy\.reduce\(\s*[\"']MEAN[\"']", source):
        return True, f"{name} averages the first batch over the replicas with strategy.reduce"
    return False, f"{name} no longer averages the first batch over the replicas"


def make_replacement(original_build):

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if iterator is None or strategy is None:
            return original_build(self, iterator=iterator, data_batch=data_batch)
        # Keras 3.12 and later yield (begin_step, end_step, iterator), earlier (step, iterator).
        for item in iterator:
            batch = next(item[-1])
            data_batch = keras.tree.map_structure(
                lambda v: _topology.local_copy(v, strategy), batch
            )
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    return _maybe_symbolic_build
