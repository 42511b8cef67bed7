"""Timing the input pipeline alone, changing no order training sees (the throughput guide's "Advice")."""

import itertools
import time

import tensorflow as tf

from keras_scaling.internals import _tf_data

_TIMED_BATCHES = 20
# Ops that run Python: reading such a pipeline a second time may have effects.
_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc", "GeneratorDataset"})
# Ops whose state outlives an iterator: another pass over the dataset would
# advance what training's next iterator draws.
_SHARED_STATE_OPS = frozenset(
    """ShuffleDataset ShuffleDatasetV2 ShuffleDatasetV3 ShuffleAndRepeatDataset
    ShuffleAndRepeatDatasetV2 RandomDataset RandomDatasetV2 ExperimentalRandomDataset
    StatefulUniform StatefulUniformInt StatefulUniformFullInt StatefulStandardNormalV2
    StatefulTruncatedNormal StatefulRandomBinomial RngReadAndSkip RngSkip AssignVariableOp
    AssignAddVariableOp AssignSubVariableOp""".split()
)


def input_samples_per_sec(iterator, clock=time.perf_counter):
    """`(samples_per_sec, None)` of this worker's input alone (20 batches after one untimed), or `(None, why not)`."""
    dataset, reason = _dataset_to_time(iterator)
    if dataset is None:
        return None, reason
    batches = iter(dataset)
    next(batches)
    start_s = clock()
    timed = itertools.islice(batches, _TIMED_BATCHES)
    samples = sum(int(tf.nest.flatten(batch)[0].shape[0]) for batch in timed)
    elapsed_s = clock() - start_s
    if samples == 0 or elapsed_s <= 0:
        return None, "it yielded too few batches"
    return samples / elapsed_s, None


def _dataset_to_time(iterator):
    """A dataset whose reading leaves training's data as it is, or `(None, why not)`."""
    from keras_scaling import data
    from keras_scaling.data import _iterator_plan

    distributed = _iterator_plan.distributed_dataset(iterator)
    own_state = distributed is not None  # built again, its shuffle and cache are its own
    if own_state:
        dataset = data._independent_copy(distributed)
    else:
        dataset = _tf_data.dataset_of_iterator(iterator)
    if dataset is None:
        return None, "its dataset is out of reach"
    ops = _tf_data.op_types(dataset)
    if ops is None:
        return None, "its graph cannot be inspected"
    if ops & _PYTHON_OPS:
        return None, "it runs Python code, which may not be safe to read twice"
    if not own_state and ops & _SHARED_STATE_OPS:
        return None, (
            "it shuffles or draws random numbers with state that training's next pass shares, so reading it would change the order training sees (a dataset of keras_scaling.data.distribute can be timed)"
        )
    return dataset, None
