"""The `keras_scaling.data` plan behind the iterator `fit` trains from."""

import tensorflow as tf

from keras_scaling import _tf_data_internals


def planned_global_batch_size(iterator):
    """The global batch of the `keras_scaling.data` plan behind `iterator`, or None.

    `fit` distributes the dataset it is given; the datasets TensorFlow derives
    from it keep it as an input, so the plan is found up that chain.

    Args:
        iterator: the iterator Keras' train function is called with.

    Returns:
        int, samples per optimizer step over all replicas, or None when no
        dataset on the way was made by `keras_scaling.data.distribute`.
    """
    from keras_scaling import data

    pending = [_tf_data_internals.dataset_of_iterator(iterator)]
    seen = set()
    while pending:
        dataset = pending.pop()
        if not isinstance(dataset, tf.data.Dataset) or id(dataset) in seen:
            continue
        seen.add(id(dataset))
        plan = data.plan_of(dataset)
        if plan is not None:
            return plan.global_batch_size
        pending.extend(_tf_data_internals.dataset_inputs(dataset))
    return None
