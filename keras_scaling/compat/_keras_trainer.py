"""Where Keras keeps its TensorFlow trainer: the one place that names it.

The trainer module is private and changes between releases (Keras 3.8 to
3.15 call the class `TensorFlowTrainer`, the next release `Trainer`); the
fixes get None here when it cannot be found, and report themselves off.
"""

import importlib

from keras_scaling.devices import _topology
from keras_scaling.internals import _probes

_TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"
_DATASET_ADAPTER_MODULE = "keras.src.trainers.data_adapters.tf_dataset_adapter"
# The trainer class's name in each Keras release, newest first.
_TRAINER_CLASS_NAMES = ("Trainer", "TensorFlowTrainer")

_LOST = (
    "the keras_scaling.compat fixes (steps_per_execution > 1 on several "
    "replicas, fit under MultiWorkerMirroredStrategy) cannot be applied"
)
_WORKAROUND = (
    "Use steps_per_execution=1 with several replicas, or a Keras release "
    "listed under 'Supported versions' in keras_scaling's README."
)


def _find_trainer_class(module):
    import keras

    for candidate in keras.Model.__mro__:
        if (
            candidate.__module__ == module.__name__
            and module.__dict__.get(candidate.__name__) is candidate
        ):
            return candidate
    raise AttributeError(
        f"keras.Model inherits from no class of {_TRAINER_MODULE} (Keras 3.8 to "
        f"3.15 call it {' or '.join(reversed(_TRAINER_CLASS_NAMES))})"
    )


@_probes.guarded(
    "keras.trainer_module",
    reaches=_TRAINER_MODULE,
    lost=_LOST,
    workaround=_WORKAROUND,
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
    """Keras' TensorFlow trainer class (`TensorFlowTrainer` or `Trainer`), or None."""
    module = trainer_module()
    return None if module is None else _find_trainer_class(module)


@_probes.guarded(
    "keras.tf_dataset_adapter",
    reaches=f"{_DATASET_ADAPTER_MODULE}.TFDatasetAdapter",
    lost="the multi_worker_epoch fix (whole epochs of a worker's share under "
    "MultiWorkerMirroredStrategy) cannot be applied",
    workaround=(
        "Under MultiWorkerMirroredStrategy, pass steps_per_epoch= to fit "
        "(the batches of each worker's dataset times the number of workers)."
    ),
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
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        _topology.num_workers(strategy) > 1
    )
