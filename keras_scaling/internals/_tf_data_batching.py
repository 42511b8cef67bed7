"""How a `tf.data.Dataset` was batched, and what Keras' directory utilities decode files with.

tf.data has no public API for either; only the reads of private names are guarded, the walks are plain code.
"""

import dataclasses

import tensorflow as tf

from keras_scaling.internals import _probes

# Transformations that leave elements batched, by private class name.
BATCHING_DATASETS = {
    "_BatchDataset": ".batch()",
    "_ParallelBatchDataset": ".batch(num_parallel_calls=...)",
    "_PaddedBatchDataset": ".padded_batch()",
    "_RebatchDataset": ".rebatch()",
    "_MapAndBatchDataset": "map_and_batch",
    "_DenseToRaggedDataset": ".ragged_batch()",
    "_DenseToSparseBatchDataset": "dense_to_sparse_batch",
    "_GroupByWindowDataset": ".group_by_window() / bucket_by_sequence_length",
}
# Batches padded to their own longest sample or bucketed by shape: their
# samples differ in shape from batch to batch.
RESHAPING_BATCHES = set(
    "_PaddedBatchDataset _DenseToRaggedDataset _DenseToSparseBatchDataset "
    "_GroupByWindowDataset".split()
)
# Batching steps whose batch size and input can be read.
_READABLE_BATCHES = {"_BatchDataset", "_ParallelBatchDataset", "_PaddedBatchDataset"}
# Between a batch and the dataset returned, these keep one element per batch.
_ONE_TO_ONE_DATASETS = set(
    "_PrefetchDataset _MapDataset _ParallelMapDataset _OptionsDataset CacheDataset "
    "_ShuffleDataset _AssertCardinalityDataset".split()
)
# After a batch, these keep each element one batch, though not always one element per batch.
_KEEPING_BATCHES = _ONE_TO_ONE_DATASETS | set(
    "_RepeatDataset _TakeDataset _SkipDataset _FilterDataset _ShardDataset".split()
)
_MAP_DATASETS = {"_MapDataset", "_ParallelMapDataset"}
# What tf.distribute puts around a dataset whose batches are not static: each step reads one of them.
_DISTRIBUTE_WRAPPERS = set(
    "_AutoShardDataset _PrefetchDataset _RebatchDataset _LegacyRebatchDataset _RestructuredDataset".split()
)


@_probes.guarded(
    "tf.data.batching_transformation",
    reaches="tf.data.Dataset._inputs() and the private dataset classes' names",
    lost="a batched dataset cannot be recognised, so it is taken as unbatched",
    workaround="Pass the data to distribute() before .batch(), or add .unbatch().",
)
def _dataset_node(dataset):
    """The private class name of `dataset` and the datasets it reads, or None."""
    inputs = dataset._inputs()
    if not isinstance(inputs, (list, tuple)) or not all(
        isinstance(parent, tf.data.Dataset) for parent in inputs
    ):
        raise _probes.ReachError(f"_inputs() gave {type(inputs).__name__}")
    return type(dataset).__name__, list(inputs)


def batching_transformation(dataset):
    """Names the batching transformation that produced `dataset`, or None (an unreadable walk: unbatched).

    The element shape cannot tell a batch from a sample (an image is rank 3 either way).
    """
    node = _dataset_node(dataset)
    if node is None or node[0] == "_UnbatchDataset":
        return None
    name, parents = node
    if name in BATCHING_DATASETS:
        return BATCHING_DATASETS[name]
    return next(filter(None, map(batching_transformation, parents)), None)


@dataclasses.dataclass(frozen=True)
class BatchNode:
    """The batching step of a batched dataset; None where it cannot be read.

    `samples` is the step's input cardinality; `one_batch_per_element`: every step after
    the batch keeps one element per batch; `reshapes_samples`: padded or bucketed.
    """

    transformation: str
    batch_size: int | None = None
    drop_remainder: bool | None = None
    samples: int | None = None
    one_batch_per_element: bool = False
    reshapes_samples: bool = False


def batch_node(dataset):
    """The `BatchNode` of `dataset`, up its chain of single-input steps; None when unbatched."""
    transformation = batching_transformation(dataset)
    if transformation is None:
        return None
    unknown = BatchNode(transformation=transformation)
    node, one_to_one = _dataset_node(dataset), True
    while node is not None and node[0] not in BATCHING_DATASETS:
        name, parents = node
        if len(parents) != 1:
            return unknown
        one_to_one = one_to_one and name in _ONE_TO_ONE_DATASETS
        dataset = parents[0]
        node = _dataset_node(dataset)
    if node is None:
        return unknown
    reshapes = node[0] in RESHAPING_BATCHES
    fields = _batch_fields(dataset) if node[0] in _READABLE_BATCHES else None
    if fields is None:
        return dataclasses.replace(unknown, reshapes_samples=reshapes)
    batch_size, drop_remainder, batch_input = fields
    return BatchNode(
        transformation=transformation,
        batch_size=None if batch_size is None else int(batch_size),
        drop_remainder=None if drop_remainder is None else bool(drop_remainder),
        samples=int(batch_input.cardinality()),
        one_batch_per_element=one_to_one,
        reshapes_samples=reshapes,
    )


def distributed_batch_size(dataset):
    """The size of the batches each step of tf.distribute's `dataset` reads (an epoch's last may be smaller),
    through the steps that keep each element a batch: a `.batch()` or `.padded_batch()`'s, or the index
    batches' of Keras' array adapter (`fit(x, y, batch_size=...)`); or None."""
    node = _dataset_node(dataset)
    for walked in (_DISTRIBUTE_WRAPPERS, _KEEPING_BATCHES):
        while node is not None and node[0] in walked and len(node[1]) == 1:
            dataset = node[1][0]
            node = _dataset_node(dataset)
    if node is not None and node[0] in _READABLE_BATCHES:
        fields = _batch_fields(dataset)
        return None if fields is None or fields[0] is None else int(fields[0])
    if node is not None and node[0] == "_ZipDataset" and len(node[1]) == 2:
        return _array_adapter_batch_size(*node[1])
    return None


def _array_adapter_batch_size(indices, arrays):
    """Keras' array adapter zips batches of indices with its arrays, repeated: the first index batch's
    length, a full batch (a partial one comes last)."""
    spec, arrays_node = indices.element_spec, _dataset_node(arrays)
    if not isinstance(spec, tf.TensorSpec) or spec.shape.rank != 1 or not spec.dtype.is_integer:
        return None
    if arrays_node is None or arrays_node[0] != "_RepeatDataset":
        return None
    try:
        first = next(iter(indices.take(1)), None)
    except tf.errors.OpError:  # a form this reading does not know: the size stays unknown
        return None
    return None if first is None else int(first.shape[0])


@_probes.guarded(
    "tf.data.batch_node",
    reaches="the batching dataset's _input_dataset, _batch_size and _drop_remainder",
    lost="the batch size and sample count of a batched dataset cannot be read, so they are measured from the data instead",
    workaround="Pass distribute(num_samples=...) to skip counting the data.",
)
def _batch_fields(node):
    """A batching dataset's static batch size, drop_remainder and input."""
    batch_input = node._input_dataset
    if not isinstance(batch_input, tf.data.Dataset):
        raise _probes.ReachError(f"_input_dataset is a {type(batch_input).__name__}")
    static = tf.get_static_value
    return static(node._batch_size), static(node._drop_remainder), batch_input


@dataclasses.dataclass(frozen=True)
class DirectoryPipeline:
    """A batched dataset of files taken apart before decoding: `files` (one element per path), the `.map()` `decoders`.

    The form `image_dataset_from_directory` and its siblings build: `from_tensor_slices(paths)`
    (or zipped with labels), optionally `.shuffle()`, `.map()` steps, `.batch()`, `.prefetch()`.
    """

    files: tf.data.Dataset
    paths: tuple
    decoders: tuple
    shuffled: bool
    batch_size: int


@_probes.guarded(
    "tf.data.directory_pipeline",
    reaches="the _input_dataset, _map_func and _tensors of a directory dataset's steps",
    lost="the files of a Keras directory dataset cannot be split between workers before decoding, so every worker decodes every file and keeps its share",
    workaround="Build the dataset from its file paths yourself and pass it to distribute() before decoding and batching.",
)
def directory_pipeline(dataset, file_paths=None):
    """The `DirectoryPipeline` of a batched dataset of files, or None (and a warning when it has Keras' `file_paths`)."""
    found = _read_directory_pipeline(dataset)
    if file_paths is None:
        return found
    if found is None:
        raise _probes.ReachError("the dataset has file_paths but not a directory utility's form")
    if len(found.paths) != len(file_paths):
        raise _probes.ReachError(f"{len(found.paths)} paths, but {len(file_paths)} file_paths")
    return found


def _read_directory_pipeline(dataset):
    node = dataset
    while type(node).__name__ == "_PrefetchDataset":
        node = node._input_dataset
    if type(node).__name__ != "_BatchDataset":
        return None
    batch_size = tf.get_static_value(node._batch_size)
    drop_remainder = tf.get_static_value(node._drop_remainder)
    if batch_size is None or drop_remainder is None or bool(drop_remainder):
        return None
    node = node._input_dataset
    decoders = []
    # audio_dataset_from_directory prefetches before its batch.
    while type(node).__name__ in _MAP_DATASETS | {"_PrefetchDataset"}:
        if type(node).__name__ in _MAP_DATASETS:
            decoder = node._map_func._func
            if not callable(decoder):
                raise _probes.ReachError("a map step without a Python function")
            decoders.append(decoder)
        node = node._input_dataset
    shuffled = type(node).__name__ == "_ShuffleDataset"
    if shuffled:
        node = node._input_dataset
    paths = _paths_of(node)
    if not decoders or paths is None:
        return None
    return DirectoryPipeline(node, paths, tuple(reversed(decoders)), shuffled, int(batch_size))


def _paths_of(node):
    """The strings of `from_tensor_slices(paths)`, alone or first in a zip."""
    if type(node).__name__ == "_ZipDataset":
        node = node._datasets[0]
    if type(node).__name__ != "_TensorSliceDataset":
        return None
    tensors = node._tensors
    if len(tensors) != 1 or tensors[0].dtype != tf.string or tensors[0].shape.rank != 1:
        return None
    return tuple(path.decode() for path in tensors[0].numpy())
