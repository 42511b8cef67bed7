"""`fit`'s global batch, found from its train function's iterator (callbacks get no handle on data)."""

import logging

import tensorflow as tf

from keras_scaling import _validation
from keras_scaling.internals import _tf_data, _tf_data_batching

logger = logging.getLogger("keras_scaling")


class GlobalBatchSizeUnknown(ValueError):
    """The samples of a step cannot be counted, so throughput is unknown."""


def global_batch_size(given, iterator, element_spec, num_replicas):
    """Samples per step over all replicas: `given` (warns if the static batches disagree), else
    the plan behind `iterator`, else the static batch in `element_spec` times `num_replicas`, else
    the size of the `.batch()` behind `iterator`; `GlobalBatchSizeUnknown` when nothing tells it."""
    from keras_scaling import data

    specs = tf.nest.flatten(element_spec, expand_composites=True)
    sizes = {s.shape[0] for s in specs if getattr(s, "shape", None) is not None and s.shape.rank}
    static = sizes.pop() * num_replicas if len(sizes) == 1 and None not in sizes else None
    if given is not None and static is not None and static != given:
        logger.warning(
            "ThroughputLogger: global_batch_size=%d, but the data's batches hold %d samples over %d replicas",
            given, static, num_replicas,
        )  # fmt: skip
    plan = None if given is not None else data.plan_of(distributed_dataset(iterator))
    size = given if plan is None else plan.global_batch_size
    size = static if size is None else size
    if size is None:
        dataset = _tf_data.dataset_of_iterator(iterator)
        size = None if dataset is None else _tf_data_batching.distributed_batch_size(dataset)
    if size is None:
        raise GlobalBatchSizeUnknown(
            f"ThroughputLogger cannot tell the global batch size: the training data's batch dimension is not static (element_spec: {element_spec}). Pass ThroughputLogger(global_batch_size=<samples per step over all replicas>), or batch with drop_remainder=True (as keras_scaling.data.distribute does)."
        )
    size = _validation.positive_int(size, "global_batch_size")
    if size % num_replicas:
        raise ValueError(
            f"global_batch_size={size} is not divisible by the {num_replicas} replicas: pass the samples of one optimizer step over all replicas."
        )
    return size


def distributed_dataset(iterator):
    """The dataset `keras_scaling.data.distribute` made behind `iterator`, or None."""
    return distribute_dataset_behind(_tf_data.dataset_of_iterator(iterator))


def distribute_dataset_behind(dataset):
    """The dataset of `distribute` among `dataset` and those it was made from, or None."""
    from keras_scaling import data

    pending, seen = [dataset], set()
    while pending:
        dataset = pending.pop()
        if not isinstance(dataset, tf.data.Dataset) or id(dataset) in seen:
            continue
        seen.add(id(dataset))
        if data.plan_of(dataset) is not None:
            return dataset
        pending.extend(_tf_data.dataset_inputs(dataset))
    return None
