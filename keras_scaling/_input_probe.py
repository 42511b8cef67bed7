"""Timing the input pipeline alone: does it feed the replicas fast enough?"""

import time

import tensorflow as tf

from keras_scaling import _tf_data_internals

_PROBE_BATCHES = 20
# Ops that run Python: reading such a pipeline a second time may have effects.
_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc", "GeneratorDataset"})


def input_samples_per_sec(iterator, clock=time.perf_counter):
    """This worker's input samples/sec, read alone, or `(None, why not)`.

    A fresh iterator over the dataset behind `iterator` yields one untimed
    batch, then up to 20 timed ones; training's own iterator is not touched.

    Args:
        iterator: the iterator Keras' train function is called with.
        clock: callable returning seconds.

    Returns:
        `(samples_per_sec, None)`, or `(None, reason)` when the pipeline is out
        of reach, runs Python code, or yields too little.
    """
    dataset = _tf_data_internals.dataset_of_iterator(iterator)
    if dataset is None:
        return None, "its dataset is out of reach"
    ops = _tf_data_internals.op_types(dataset)
    if ops is None:
        return None, "its graph cannot be inspected"
    if ops & _PYTHON_OPS:
        return None, "it runs Python code, which may not be safe to read twice"
    batches = iter(dataset)
    next(batches)
    samples = 0
    start_s = clock()
    for _ in range(_PROBE_BATCHES):
        try:
            batch = next(batches)
        except StopIteration:
            break
        samples += int(tf.nest.flatten(batch)[0].shape[0])
    elapsed_s = clock() - start_s
    if samples == 0 or elapsed_s <= 0:
        return None, "it yielded too few batches"
    return samples / elapsed_s, None
