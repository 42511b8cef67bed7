"""The one place that reads private parts of a `tf.data.Dataset`.

tf.data has no public API to ask a dataset how it was built: whether it was
batched, with what batch size, how many elements went into the batch, or
what Keras' directory utilities decode each file with. These probes walk the
dataset's inputs (`_inputs()`, `_input_dataset`, `_batch_size`,
`_map_func`) and check every name and shape they rely on. Each is guarded
by `keras_scaling.internals._probes`: when something is not what they know, they
answer "unknown" and log ONE warning naming the Keras and TensorFlow versions
and what is lost. Only the reads of private names are guarded; the walks
over what they read are plain code, whose errors propagate.
"""

import dataclasses

import tensorflow as tf

from keras_scaling.internals import _probes

# Transformations that leave elements batched; the walk up a dataset's inputs
# stops at the first of these (batched) or at an `unbatch` (not batched).
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
# Batches whose samples are padded to their own batch's longest one (or
# bucketed by shape), so unbatching them does not give samples of one shape.
RESHAPING_BATCHES = {
    "_PaddedBatchDataset",
    "_DenseToRaggedDataset",
    "_DenseToSparseBatchDataset",
    "_GroupByWindowDataset",
}
_UNBATCHING_DATASETS = {"_UnbatchDataset"}
# Between a batch and the dataset returned, these keep one element per batch.
_ONE_TO_ONE_DATASETS = {
    "_PrefetchDataset",
    "_MapDataset",
    "_ParallelMapDataset",
    "_OptionsDataset",
    "_CacheDataset",
    "_MemoryCacheDataset",
    "_ShuffleDataset",
    "_AssertCardinalityDataset",
}
_MAP_DATASETS = {"_MapDataset", "_ParallelMapDataset"}


@_probes.guarded(
    "tf.data.batching_transformation",
    reaches="tf.data.Dataset._inputs() and the private dataset classes' names",
    lost="a batched dataset cannot be recognised, so it is taken as unbatched",
    workaround="Pass the data to distribute() before .batch(), or add .unbatch().",
)
def _dataset_node(dataset):
    """The reach: the private class name of `dataset` and the datasets it reads."""
    inputs = dataset._inputs()
    if not isinstance(inputs, (list, tuple)) or not all(
        isinstance(parent, tf.data.Dataset) for parent in inputs
    ):
        raise _probes.ReachError(f"_inputs() gave {type(inputs).__name__}")
    return type(dataset).__name__, list(inputs)


class _Unreadable(Exception):
    """A node of the dataset graph could not be read (its probe has warned)."""


def _read_node(dataset):
    node = _dataset_node(dataset)
    if node is None:
        raise _Unreadable
    return node


def batching_transformation(dataset):
    """Names the batching transformation that produced `dataset`, or None.

    The element shape cannot tell a batch from a sample (an image is rank 3
    either way), so this walks the dataset's inputs instead. When the walk
    fails, the dataset is taken as unbatched, with one warning.
    """
    try:
        return _find_batching(dataset)
    except _Unreadable:
        return None


def _find_batching(dataset):
    name, parents = _read_node(dataset)
    if name in _UNBATCHING_DATASETS:
        return None
    if name in BATCHING_DATASETS:
        return BATCHING_DATASETS[name]
    for parent in parents:
        found = _find_batching(parent)
        if found is not None:
            return found
    return None


@dataclasses.dataclass(frozen=True)
class BatchNode:
    """The batching step of a batched dataset, as far as it can be read.

    Args:
        transformation: its name in user terms, e.g. `".batch()"`.
        batch_size: int, or None when it cannot be read.
        drop_remainder: bool, or None when it cannot be read.
        samples: elements that go into the batching step (its input's
            cardinality, negative when unknown), or None.
        one_batch_per_element: whether every transformation after the batch
            keeps one element per batch (so the dataset's elements are the
            batches, and counting them counts batches).
        reshapes_samples: samples are padded to their batch's longest one or
            bucketed, so unbatched samples differ in shape between batches.
    """

    transformation: str
    batch_size: int | None = None
    drop_remainder: bool | None = None
    samples: int | None = None
    one_batch_per_element: bool = False
    reshapes_samples: bool = False


def batch_node(dataset):
    """Reads the batching step of `dataset`; None when it is not batched.

    Follows the chain of single-input transformations from `dataset` up to
    the first batching step. When the chain or the batching step is not of a
    known form, the fields that could not be read are None (one warning).
    """
    transformation = batching_transformation(dataset)
    if transformation is None:
        return None
    return _read_batch_node(dataset, transformation)


def _read_batch_node(dataset, transformation):
    node, one_to_one = dataset, True
    try:
        name, parents = _read_node(node)
        while name not in BATCHING_DATASETS:
            if len(parents) != 1:
                return BatchNode(transformation=transformation)
            one_to_one = one_to_one and name in _ONE_TO_ONE_DATASETS
            node = parents[0]
            name, parents = _read_node(node)
    except _Unreadable:
        return BatchNode(transformation=transformation)
    if name not in ("_BatchDataset", "_ParallelBatchDataset", "_PaddedBatchDataset"):
        return BatchNode(
            transformation=transformation,
            reshapes_samples=name in RESHAPING_BATCHES,
        )
    fields = _batch_fields(node)
    if fields is None:
        return BatchNode(transformation=transformation)
    batch_size, drop_remainder, batch_input = fields
    return BatchNode(
        transformation=transformation,
        batch_size=None if batch_size is None else int(batch_size),
        drop_remainder=None if drop_remainder is None else bool(drop_remainder),
        samples=int(batch_input.cardinality()),
        one_batch_per_element=one_to_one,
        reshapes_samples=name in RESHAPING_BATCHES,
    )


@_probes.guarded(
    "tf.data.batch_node",
    reaches="the batching dataset's _input_dataset, _batch_size and _drop_remainder",
    lost=(
        "the batch size and sample count of a batched dataset cannot be read, "
        "so they are measured from the data instead"
    ),
    workaround="Pass distribute(num_samples=...) to skip counting the data.",
)
def _batch_fields(node):
    """The reach: a batching dataset's static batch size, drop_remainder and input."""
    batch_input = node._input_dataset
    if not isinstance(batch_input, tf.data.Dataset):
        raise _probes.ReachError(f"_input_dataset is a {type(batch_input).__name__}")
    return (
        tf.get_static_value(node._batch_size),
        tf.get_static_value(node._drop_remainder),
        batch_input,
    )


@dataclasses.dataclass(frozen=True)
class DirectoryPipeline:
    """A batched dataset of files, taken apart before its decoding.

    `image_dataset_from_directory`, `text_dataset_from_directory` and
    `audio_dataset_from_directory` build `from_tensor_slices(file_paths)`
    (zipped with the labels), optionally `.shuffle()`, one or more `.map()`
    that read and decode each file, then `.batch()` and `.prefetch()`; so
    does many a hand-written pipeline over image files.

    Args:
        files: the dataset of undecoded elements (a path, or a path and its
            label), one per file.
        paths: the file paths, in the order of `files`.
        decoders: the Python functions of the `.map()` steps, in order.
        shuffled: whether the pipeline shuffled the files itself.
        batch_size: the pipeline's batch size.
    """

    files: tf.data.Dataset
    paths: tuple
    decoders: tuple
    shuffled: bool
    batch_size: int


@_probes.guarded(
    "tf.data.directory_pipeline",
    reaches="the _input_dataset, _map_func and _tensors of a directory dataset's steps",
    lost=(
        "the files of a Keras directory dataset cannot be split between "
        "workers before decoding, so every worker decodes every file and "
        "keeps its share"
    ),
    workaround=(
        "Build the dataset from its file paths yourself and pass it to "
        "distribute() before decoding and batching."
    ),
)
def directory_pipeline(dataset, file_paths=None):
    """Takes apart a batched dataset of files, or returns None.

    The form is `from_tensor_slices(paths)` (or zipped with labels), an
    optional `.shuffle()`, `.map()` steps, `.batch()` and `.prefetch()`.
    Other datasets give None. A dataset with `file_paths` (set by Keras'
    directory utilities) that is not of this form gives None and one
    warning: it is then read as any batched dataset, and every worker
    decodes every file.
    """
    found = _read_directory_pipeline(dataset)
    if file_paths is None:
        return found
    if found is None:
        raise _probes.ReachError(
            "the dataset has file_paths but not the form of a directory utility's"
        )
    if len(found.paths) != len(file_paths):
        raise _probes.ReachError(
            f"{len(found.paths)} paths before decoding, {len(file_paths)} file_paths"
        )
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
    while type(node).__name__ in _MAP_DATASETS or type(node).__name__ == "_PrefetchDataset":
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
    return DirectoryPipeline(
        files=node,
        paths=paths,
        decoders=tuple(reversed(decoders)),
        shuffled=shuffled,
        batch_size=int(batch_size),
    )


def _paths_of(node):
    """The strings of `from_tensor_slices(paths)`, alone or first in a zip."""
    if type(node).__name__ == "_ZipDataset":
        node = node._datasets[0]
        if not isinstance(node, tf.data.Dataset):
            return None
    if type(node).__name__ != "_TensorSliceDataset":
        return None
    tensors = node._tensors
    if len(tensors) != 1 or tensors[0].dtype != tf.string or tensors[0].shape.rank != 1:
        return None
    return tuple(path.decode() for path in tensors[0].numpy())
