"""Recognises what `distribute` was given and checks it: arrays, a dataset or files."""

import dataclasses
import os

import keras
import numpy as np
import tensorflow as tf

# Transformations that leave elements batched; the walk up a dataset's inputs
# stops at the first of these (batched) or at an `unbatch` (not batched).
_BATCHING_DATASETS = {
    "_BatchDataset": ".batch()",
    "_ParallelBatchDataset": ".batch(num_parallel_calls=...)",
    "_PaddedBatchDataset": ".padded_batch()",
    "_RebatchDataset": ".rebatch()",
    "_MapAndBatchDataset": "map_and_batch",
    "_DenseToRaggedDataset": ".ragged_batch()",
    "_DenseToSparseBatchDataset": "dense_to_sparse_batch",
    "_GroupByWindowDataset": ".group_by_window() / bucket_by_sequence_length",
}
_UNBATCHING_DATASETS = {"_UnbatchDataset"}


@dataclasses.dataclass
class ArraySource:
    """In-memory arrays in `fit`'s layout: `x`, `(x, y)` or `(x, y, sample_weight)`."""

    arrays: object
    num_examples: int
    has_targets: bool
    num_files = None


@dataclasses.dataclass
class DatasetSource:
    """An unbatched `tf.data.Dataset` of known, finite cardinality."""

    dataset: tf.data.Dataset
    num_examples: int
    has_targets: bool
    num_files = None


@dataclasses.dataclass
class FileSource:
    """TFRecord files, with the number of records in each."""

    paths: tuple
    file_sizes: tuple
    num_examples: int

    @property
    def num_files(self):
        return len(self.paths)


def _is_path(value):
    return isinstance(value, (str, bytes, os.PathLike))


def _is_file_list(data):
    if _is_path(data):
        return True
    return (
        isinstance(data, (list, tuple))
        and len(data) > 0
        and all(_is_path(item) for item in data)
    )


def inspect_data(data, parse_fn=None):
    """Classifies and validates `data`; returns an `ArraySource`,
    `DatasetSource` or `FileSource`."""
    if parse_fn is not None and not callable(parse_fn):
        raise TypeError(
            f"parse_fn must be a function taking one element (a serialized "
            f"record for files), got {type(parse_fn).__name__}."
        )
    if isinstance(data, tf.data.Dataset):
        return _inspect_dataset(data)
    if _is_file_list(data):
        return _inspect_files(data, parse_fn)
    return _inspect_arrays(data)


def _inspect_dataset(dataset):
    batching = batching_transformation(dataset)
    if batching is not None:
        raise ValueError(
            f"data is already batched (it was built with {batching}). "
            "distribute() batches the data itself, to the global batch size: "
            "pass the dataset before batching, or add .unbatch()."
        )
    if any(
        isinstance(spec, tf.data.DatasetSpec)
        for spec in tf.nest.flatten(dataset.element_spec)
    ):
        raise ValueError(
            "data yields datasets (as from .window()), not tensors: flatten it "
            "first, e.g. dataset.flat_map(lambda w: w)."
        )
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise ValueError(
            "data is an infinite dataset (.repeat() without a count): "
            "distribute() needs the number of samples to give every replica "
            "and worker the same steps. Pass the dataset before .repeat(); "
            "Keras starts a new pass every epoch."
        )
    if cardinality == tf.data.UNKNOWN_CARDINALITY:
        raise ValueError(
            "data has an unknown number of samples (for example after "
            ".filter() or .unbatch()), which distribute() needs to give every "
            "replica and worker the same number of steps. If you know it, declare "
            "it: dataset.apply(tf.data.experimental.assert_cardinality(n)); "
            "otherwise count it once (dataset.reduce(0, lambda n, _: n + 1)) "
            "and declare that."
        )
    if cardinality == 0:
        raise ValueError("data is an empty dataset: there is nothing to train on.")
    element = dataset.element_spec
    has_targets = isinstance(element, tuple) and len(element) >= 2
    return DatasetSource(dataset, cardinality, has_targets)


def batching_transformation(dataset):
    """Names the batching transformation that produced `dataset`, or None.

    The element shape cannot tell a batch from a sample (an image is rank 3
    either way), so this walks the dataset's inputs instead.
    """
    name = type(dataset).__name__
    if name in _UNBATCHING_DATASETS:
        return None
    if name in _BATCHING_DATASETS:
        return _BATCHING_DATASETS[name]
    for parent in dataset._inputs():
        found = batching_transformation(parent)
        if found is not None:
            return found
    return None


def _inspect_files(data, parse_fn):
    paths = (data,) if _is_path(data) else tuple(data)
    paths = tuple(os.fsdecode(path) for path in paths)
    if parse_fn is None:
        raise ValueError(
            f"data is a list of {len(paths)} file(s), which needs parse_fn: a "
            "function from one serialized record to the sample, such as "
            "lambda record: tf.io.parse_single_example(record, features)."
        )
    missing = [path for path in paths if not tf.io.gfile.exists(path)]
    if missing:
        shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise ValueError(
            f"data names {len(missing)} file(s) that do not exist: {shown}. "
            "Check the paths (relative paths are resolved from "
            f"{os.getcwd()})."
        )
    file_sizes = tuple(count_records(path) for path in paths)
    total = sum(file_sizes)
    if total == 0:
        raise ValueError(
            f"data's {len(paths)} file(s) hold no records: there is nothing to "
            "train on."
        )
    return FileSource(paths, file_sizes, total)


def count_records(path):
    """Counts the records of one TFRecord file, reading it without parsing."""
    records = tf.data.TFRecordDataset(path, buffer_size=1 << 20)
    return int(records.reduce(np.int64(0), lambda count, _: count + 1))


def _split_fit_layout(data):
    """Returns `(structure, has_targets)` with trailing `None`s removed, as
    `fit` accepts `(x, None)` and `(x, y, None)`."""
    if isinstance(data, tuple):
        if not 1 <= len(data) <= 3:
            raise ValueError(
                f"data as a tuple must be (x,), (x, y) or (x, y, sample_weight) "
                f"like model.fit takes, got a tuple of {len(data)} items. Pass "
                "several inputs as a list or dict in x: ([x1, x2], y)."
            )
        items = list(data)
        while items and items[-1] is None:
            items.pop()
        if not items or any(item is None for item in items):
            raise ValueError(
                "data has None in place of x or y: pass (x, y) or "
                "(x, y, sample_weight) with arrays."
            )
        return tuple(items), len(items) >= 2
    return data, False


def _inspect_arrays(data):
    structure, has_targets = _split_fit_layout(data)
    leaves = tf.nest.flatten(structure)
    if not leaves:
        raise ValueError("data holds no arrays: pass x, (x, y) or (x, y, sample_weight).")
    lengths = {}
    paths = _leaf_names(structure)
    for name, leaf in zip(paths, leaves):
        if not hasattr(leaf, "shape") and not isinstance(leaf, (list, np.generic)):
            raise TypeError(
                "data must be a tf.data.Dataset, a list of TFRecord file paths "
                "(with parse_fn), or NumPy arrays as model.fit takes them "
                f"(x, (x, y) or (x, y, sample_weight)); {name} is a "
                f"{type(leaf).__name__}."
            )
        shape = np.shape(leaf)
        if len(shape) == 0:
            raise ValueError(
                f"data's {name} is a scalar: arrays need a first dimension "
                "that counts the samples."
            )
        lengths[name] = shape[0]
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{name} has {length}" for name, length in lengths.items())
        raise ValueError(
            f"data's arrays have different numbers of samples ({detail}); every "
            "array needs one row per sample."
        )
    num_examples = next(iter(lengths.values()))
    if num_examples == 0:
        raise ValueError("data's arrays are empty: there is nothing to train on.")
    arrays = tf.nest.map_structure(tf.convert_to_tensor, _lists_to_tuples(structure))
    return ArraySource(arrays, int(num_examples), has_targets)


def _lists_to_tuples(structure):
    """Turns lists (several inputs, as `fit` takes them) into tuples, which
    tf.data keeps as separate components; it would stack a list into one
    tensor."""
    if isinstance(structure, (list, tuple)):
        return tuple(_lists_to_tuples(item) for item in structure)
    if isinstance(structure, dict):
        return {key: _lists_to_tuples(value) for key, value in structure.items()}
    return structure


def _leaf_names(structure):
    if isinstance(structure, tuple) and 1 <= len(structure) <= 3:
        roles = ("x", "y", "sample_weight")
        names = []
        for role, item in zip(roles, structure):
            names.extend(_nested_names(role, item))
        return names
    return _nested_names("x", structure)


def _nested_names(prefix, item):
    flat = tf.nest.flatten(item)
    if len(flat) == 1 and not isinstance(item, (dict, list, tuple)):
        return [prefix]
    paths = keras.tree.flatten_with_path(item)
    return [prefix + "".join(f"[{key!r}]" for key in path) for path, _ in paths]
