"""Recognises and checks what `distribute` was given, and counts its samples."""

import dataclasses
import inspect
import logging
import os
import time

import keras
import numpy as np
import tensorflow as tf

from keras_scaling.data import _py_dataset
from keras_scaling.internals import _tf_data_batching

logger = logging.getLogger("keras_scaling")

# Elements whose counts are summed on the device before one reaches Python.
COUNT_CHUNK_ELEMENTS = 1024
ESTIMATE_AFTER_S = 1.0


def samples_in(element, batched):
    """The number of samples in one element: 1, or the first dimension."""
    if not batched:
        return tf.constant(1, tf.int64)
    first = tf.nest.flatten(element)[0]
    if isinstance(first, tf.SparseTensor):
        return tf.cast(first.dense_shape[0], tf.int64)
    rows = first.nrows() if isinstance(first, tf.RaggedTensor) else tf.shape(first)[0]
    return tf.cast(rows, tf.int64)


def estimated_seconds(elapsed_s, elements_read, elements_total):
    """The time left at the pace so far (1024 of 10 240 in 2 s leave 18 s), or None."""
    if elements_total is None or elements_total < 0 or elements_read == 0:
        return None
    return elapsed_s / elements_read * max(elements_total - elements_read, 0)


def count_samples(dataset, *, batched):
    """Reads a finite `dataset` once; returns its samples (elements, or their first dimensions)."""
    elements_total = int(dataset.cardinality())
    counts = dataset.map(
        lambda *element: samples_in(_py_dataset.unpack(element), batched),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    chunks = counts.batch(COUNT_CHUNK_ELEMENTS).map(
        lambda sizes: (tf.reduce_sum(sizes), tf.size(sizes, out_type=tf.int64))
    )
    start, samples, elements, progress = time.perf_counter(), 0, 0, None
    for chunk_samples, chunk_elements in chunks.as_numpy_iterator():
        samples, elements = samples + int(chunk_samples), elements + int(chunk_elements)
        elapsed_s = time.perf_counter() - start
        if progress is None and elapsed_s >= ESTIMATE_AFTER_S:
            left_s = estimated_seconds(elapsed_s, elements, elements_total)
            left = "total unknown" if left_s is None else f"about {left_s:.0f} s more"
            logger.warning(
                "Counting the samples of data by reading it once (its length is not known): %s at %.0f samples/s. Pass num_samples= to skip this.",
                left, samples / elapsed_s,
            )  # fmt: skip
            target = elements_total if elements_total >= 0 else None
            progress = keras.utils.Progbar(target, unit_name="element")
        if progress is not None:
            progress.update(elements)
    if progress is not None and progress.target is None:
        progress.update(elements, finalize=True)
    elapsed_s = time.perf_counter() - start
    logger.info("Counted %d samples in data in %.1f s (num_samples= skips it).", samples, elapsed_s)
    return samples


@dataclasses.dataclass
class ArraySource:
    """In-memory arrays in `fit`'s layout: `x`, `(x, y)` or `(x, y, sample_weight)`."""

    arrays: object
    num_examples: int
    num_files = batch_size = None
    kind, notes, default_shuffle = "arrays", (), True


@dataclasses.dataclass
class DatasetSource:
    """A `tf.data.Dataset` of samples; `batch_size` is the batch it came in, if any."""

    dataset: tf.data.Dataset
    num_examples: int
    batch_size: int | None = None
    kind: str = "tf.data.Dataset"
    notes: tuple = ()
    num_files, default_shuffle = None, False


@dataclasses.dataclass
class DirectorySource:
    """A directory utility's dataset: `files` (path, or path and label) before `decoders`."""

    files: tf.data.Dataset
    decoders: tuple
    paths: tuple
    batch_size: int
    shuffled: bool
    notes: tuple = ()
    kind = "dataset of files (from_tensor_slices(paths), .map(), .batch())"
    num_examples = num_files = property(lambda self: len(self.paths))
    file_sizes = property(lambda self: (1,) * len(self.paths))
    default_shuffle = property(lambda self: self.shuffled)

    def positions_of(self, file_indices):
        """The dataset positions of files numbered in path order, the same on every worker."""
        by_path = sorted(range(len(self.paths)), key=lambda index: self.paths[index])
        return sorted(by_path[index] for index in file_indices)


@dataclasses.dataclass
class FileSource:
    """TFRecord files, with the number of records in each."""

    paths: tuple
    file_sizes: tuple
    num_examples: int
    batch_size, kind, notes, default_shuffle = None, "TFRecord files", (), True
    num_files = property(lambda self: len(self.paths))


def _is_path(value):
    return isinstance(value, (str, bytes, os.PathLike))


def _is_path_list(value):
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(map(_is_path, value))


def inspect_data(data, parse_fn=None, num_samples=None, output_signature=None):
    """The `...Source` that describes `data`."""
    if parse_fn is not None and not callable(parse_fn):
        raise TypeError(
            f"parse_fn must be a function taking one element (a serialized record for files), got {type(parse_fn).__name__}."
        )
    if inspect.isgenerator(data):
        raise TypeError(
            "data is a generator object, read only once, but every epoch needs a new pass. Pass the generator function itself, with output_signature= and num_samples=."
        )
    if output_signature is not None:
        if not callable(data) or isinstance(data, tf.data.Dataset):
            raise TypeError(
                f"output_signature is for a generator function (data=make_samples, where make_samples() yields samples), but data is a {type(data).__name__}."
            )
        data = tf.data.Dataset.from_generator(data, output_signature=output_signature)
        return _inspect_dataset(data, num_samples, kind="generator function")
    if inspect.isgeneratorfunction(data):
        raise TypeError(
            "data is a generator function: pass output_signature= (the tf.TensorSpec of one sample, as for tf.data.Dataset.from_generator) and num_samples=."
        )
    if isinstance(data, keras.utils.PyDataset):
        return _py_dataset.inspect_py_dataset(data, num_samples)
    if isinstance(data, tf.data.Dataset):
        return _inspect_dataset(data, num_samples)
    if _is_path(data) or _is_path_list(data):
        return _check_count(_inspect_files(data, parse_fn), num_samples)
    return _check_count(_inspect_arrays(data), num_samples)


def _check_count(source, num_samples, found_from="the data"):
    if num_samples is not None and num_samples != source.num_examples:
        raise ValueError(
            f"num_samples={num_samples} contradicts {found_from}, which holds {source.num_examples} samples. Leave num_samples out when the data knows its length."
        )
    return source


def _inspect_dataset(dataset, num_samples, kind="tf.data.Dataset"):
    if any(isinstance(spec, tf.data.DatasetSpec) for spec in tf.nest.flatten(dataset.element_spec)):
        raise ValueError(
            "data yields datasets (as from .window()), not tensors: flatten it first, e.g. dataset.flat_map(lambda w: w)."
        )
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise ValueError(
            "data is an infinite dataset (.repeat() without a count), but distribute() needs the number of samples to give every worker the same steps: pass the dataset before .repeat(); Keras starts a new pass every epoch."
        )
    if cardinality == 0:
        raise ValueError("data is an empty dataset: there is nothing to train on.")
    batch = _tf_data_batching.batch_node(dataset)
    if batch is not None:
        return _inspect_batched(dataset, batch, cardinality, num_samples)
    if cardinality >= 0:
        source = DatasetSource(dataset, cardinality, kind=kind)
        return _check_count(source, num_samples, found_from="the dataset's cardinality")
    count, note = _declared_or_counted(dataset, num_samples, batched=False)
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(count))
    return DatasetSource(dataset, count, kind=kind, notes=(note,))


def _declared_or_counted(dataset, num_samples, *, batched):
    """`num_samples` if given (TensorFlow checks it as read), else one counting pass; and the plan's note."""
    if num_samples is not None:
        return num_samples, f"{num_samples} samples as declared by num_samples (checked as read)"
    count = count_samples(dataset, batched=batched)
    return count, f"{count} samples counted by reading the data once (num_samples= skips it)"


def _inspect_batched(dataset, batch, cardinality, num_samples):
    shapes_fixed = all(
        isinstance(spec, tf.TensorSpec) and spec.shape[1:].is_fully_defined()
        for spec in tf.nest.flatten(dataset.element_spec)
    )
    if batch.reshapes_samples and not shapes_fixed:
        raise ValueError(
            f"data is batched with {batch.transformation}, which pads or groups samples by their own batch, so they cannot be re-batched to the global batch. Pass the dataset before {batch.transformation} (distribute() batches it), or pad to a fixed shape (padded_batch(n, padded_shapes=...) with every size given; for audio_dataset_from_directory, output_sequence_length=...)."
        )
    file_paths = getattr(dataset, "file_paths", None)
    file_paths = file_paths if _is_path_list(file_paths) else None
    pipeline = _tf_data_batching.directory_pipeline(dataset, file_paths)
    if pipeline is not None:
        notes = (f"{len(pipeline.paths)} samples, one per file",)
        directory = DirectorySource(**vars(pipeline), notes=notes)
        return _check_count(directory, num_samples, found_from="the dataset's files")
    batch_size = batch.batch_size or _first_batch_size(dataset)
    samples, found_from = _batched_count(batch, cardinality, file_paths)
    if samples is None:
        samples, note = _declared_or_counted(dataset, num_samples, batched=True)
    else:
        note = f"{samples} samples from {found_from}"
    samples_dataset = dataset.unbatch().apply(tf.data.experimental.assert_cardinality(samples))
    kind = f"batched tf.data.Dataset ({batch.transformation}, batch {batch_size})"
    source = DatasetSource(samples_dataset, samples, batch_size, kind, (note,))
    return _check_count(source, num_samples, found_from=found_from)


def _batched_count(batch, cardinality, file_paths):
    """The samples of a batched dataset, when known without reading it."""
    if not batch.one_batch_per_element or cardinality < 0:
        return None, None
    if batch.drop_remainder and batch.batch_size:
        return cardinality * batch.batch_size, f"{cardinality} full batches of {batch.batch_size}"
    if batch.samples is not None and batch.samples >= 0:
        return batch.samples, f"the {batch.samples} elements before {batch.transformation}"
    if file_paths is not None:
        return len(file_paths), "the dataset's file_paths"
    return None, None


def _first_batch_size(dataset):
    for element in dataset.take(1):
        return int(samples_in(element, batched=True))
    raise ValueError("data is an empty dataset: there is nothing to train on.")


def _inspect_files(data, parse_fn):
    paths = tuple(os.fsdecode(path) for path in ((data,) if _is_path(data) else data))
    if parse_fn is None:
        raise ValueError(
            f"data is a list of {len(paths)} file(s), which needs parse_fn: a function from one serialized record to the sample, such as lambda record: tf.io.parse_single_example(record, features)."
        )
    missing = [path for path in paths if not tf.io.gfile.exists(path)]
    if missing:
        shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise ValueError(
            f"data names {len(missing)} file(s) that do not exist: {shown}. Check the paths (relative paths are resolved from {os.getcwd()})."
        )
    records = (tf.data.TFRecordDataset(path, buffer_size=1 << 20) for path in paths)
    file_sizes = tuple(int(r.reduce(np.int64(0), lambda count, _: count + 1)) for r in records)
    total = sum(file_sizes)
    if total == 0:
        raise ValueError(f"data's {len(paths)} file(s) hold no records: nothing to train on.")
    return FileSource(paths, file_sizes, total)


def _inspect_arrays(data):
    structure = data
    if isinstance(data, tuple):
        if not 1 <= len(data) <= 3:
            raise ValueError(
                f"data as a tuple must be (x,), (x, y) or (x, y, sample_weight) like model.fit takes, got a tuple of {len(data)} items. Pass several inputs as a list or dict in x: ([x1, x2], y)."
            )
        structure = _py_dataset.as_fit_layout(data)
        if not structure or any(item is None for item in structure):
            raise ValueError(
                "data has None in place of x or y: pass (x, y) or (x, y, sample_weight)."
            )
    leaves = tf.nest.flatten(structure)
    if not leaves:
        raise ValueError("data holds no arrays: pass x, (x, y) or (x, y, sample_weight).")
    lengths = {}
    for name, leaf in zip(_leaf_names(structure), leaves):
        if not hasattr(leaf, "shape") and not isinstance(leaf, (list, np.generic)):
            raise TypeError(
                f"data must be a tf.data.Dataset, a list of TFRecord file paths (with parse_fn), or NumPy arrays as model.fit takes them (x, (x, y) or (x, y, sample_weight)); {name} is a {type(leaf).__name__}."
            )
        if not np.shape(leaf):
            raise ValueError(
                f"data's {name} is a scalar: arrays need a first dimension of samples."
            )
        lengths[name] = np.shape(leaf)[0]
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{name} has {length}" for name, length in lengths.items())
        raise ValueError(
            f"data's arrays have different numbers of samples ({detail}): every array needs one row per sample."
        )
    num_examples = next(iter(lengths.values()))
    if num_examples == 0:
        raise ValueError("data's arrays are empty: there is nothing to train on.")
    # tf.data would stack a list of several inputs into one tensor.
    structure = keras.tree.lists_to_tuples(structure)
    return ArraySource(tf.nest.map_structure(tf.convert_to_tensor, structure), int(num_examples))


def _leaf_names(structure):
    """`x`, `y[0]`, `x['image']`...: the leaves' names in `tf.nest.flatten`'s order."""
    parts = structure if isinstance(structure, tuple) else (structure,)
    return [
        role + "".join(f"[{key!r}]" for key in path)
        for role, part in zip(("x", "y", "sample_weight"), parts)
        for path, _ in keras.tree.flatten_with_path(part)
    ]
