"""Private tf.data and tf.distribute names: a dataset's inputs and graph, an iterator's dataset."""

import tensorflow as tf

from keras_scaling.internals import _probes


@_probes.guarded(
    "tf.data.dataset_inputs",
    reaches="tf.data.Dataset._inputs",
    lost="a dataset's origin is not traced: the data plan behind fit's data and batching done before other transformations are not found",
    workaround="Pass the dataset from keras_scaling.data.distribute to fit as it is, and ThroughputLogger(global_batch_size=...).",
    fallback=(),
)
def dataset_inputs(dataset):
    """The datasets `dataset` was made from (empty for a source dataset)."""
    return tuple(dataset._inputs())


@_probes.guarded(
    "tf.distribute.iterator_dataset",
    reaches="DistributedIterator._iterators / _dataset",
    lost="the dataset behind fit's iterator is not found (no data plan, no input timing, no exact resume inside an epoch: BackupAndRestore resumes at the start of the saved epoch)",
    workaround="Pass ThroughputLogger(global_batch_size=...).",
)
def dataset_of_iterator(iterator):
    """This worker's `tf.data.Dataset` behind a (distributed) iterator, or None."""
    if iterator is None:
        return None
    if isinstance(iterator, tf.distribute.DistributedIterator):
        iterator = iterator._iterators[0]
    dataset = iterator._dataset
    if not isinstance(dataset, tf.data.Dataset):
        raise _probes.ReachError(f"_dataset is a {type(dataset).__name__}, not a tf.data.Dataset")
    return dataset


@_probes.guarded(
    "tf.data.serialized_graph",
    reaches="tf.data.Dataset._as_serialized_graph",
    lost="the input pipeline cannot be timed alone in the low-efficiency advice",
    workaround="Time `for batch in dataset.take(50)` yourself.",
)
def op_types(dataset):
    """The names of the ops in a dataset's graph and its functions, or None."""
    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    ops = {node.op for node in graph.node}
    ops |= {node.op for function in graph.library.function for node in function.node_def}
    return ops


@_probes.guarded(
    "tf.distribute.per_replica_spec",
    reaches="PerReplicaSpec._value_specs",
    lost="the per-replica input spec is not known for the one-replica baseline",
    workaround="Pass ThroughputLogger(baseline=...) with a measured samples/sec.",
    fallback=lambda spec: spec,
)
def first_replica_spec(spec):
    """One replica's spec from a per-replica spec; other specs as they are."""
    value_specs = getattr(spec, "_value_specs", None)
    return value_specs[0] if value_specs else spec
