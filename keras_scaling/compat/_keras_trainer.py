"""Where Keras keeps its TensorFlow trainer (private, renamed between releases): None when not found."""

import importlib

from keras_scaling.devices import _topology
from keras_scaling.internals import _probes

_TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"
_DATASET_ADAPTER_MODULE = "keras.src.trainers.data_adapters.tf_dataset_adapter"
_LOST = "the keras_scaling.compat fixes (steps_per_execution > 1, fit on several workers) are off"
_WORKAROUND = "Use steps_per_execution=1, or a Keras of 'Supported versions' in the README."


@_probes.guarded(
    "keras.trainer_module", reaches=_TRAINER_MODULE, lost=_LOST, workaround=_WORKAROUND
)
def trainer_module():
    """Keras' TensorFlow trainer module, or None when it is not where it was."""
    return importlib.import_module(_TRAINER_MODULE)


@_probes.guarded(
    "keras.trainer_class",
    reaches=f"{_TRAINER_MODULE}.TensorFlowTrainer (or Trainer)",
    lost=_LOST,
    workaround=_WORKAROUND,
)
def trainer_class():
    """The class of the trainer module `keras.Model` inherits from (`TensorFlowTrainer` up to
    Keras 3.15, `Trainer` since), or None."""
    import keras

    module = trainer_module()
    if module is None:
        return None
    for candidate in keras.Model.__mro__:
        if (
            candidate.__module__ == module.__name__
            and getattr(module, candidate.__name__, None) is candidate
        ):
            return candidate
    raise AttributeError(f"keras.Model inherits from no class of {_TRAINER_MODULE}")


@_probes.guarded(
    "keras.tf_dataset_adapter",
    reaches=f"{_DATASET_ADAPTER_MODULE}.TFDatasetAdapter",
    lost="the multi_worker_epoch fix (whole epochs on several workers) is off",
    workaround="Pass fit steps_per_epoch= (a worker's batches times the number of workers).",
)
def dataset_adapter_class():
    """Keras' adapter class for `tf.data.Dataset` inputs, or None."""
    return importlib.import_module(_DATASET_ADAPTER_MODULE).TFDatasetAdapter


def module_function(name):
    """A function of the trainer module, such as `reduce_per_replica`, or None."""
    module = trainer_module()
    return None if module is None else module.__dict__.get(name)


def is_multi_worker_collective(strategy):
    """Whether Keras treats `strategy` as multi-worker (its own test when it has one)."""
    import tensorflow as tf

    keras_test = module_function("_collective_all_reduce_multi_worker")
    if keras_test is not None:
        return keras_test(strategy)
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    return multi_worker and _topology.num_workers(strategy) > 1
