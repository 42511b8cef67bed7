"""Reads a `keras.utils.PyDataset` (each item a batch) as one worker's stream of samples."""

import collections
import concurrent.futures
import dataclasses
import itertools
from typing import Any

import numpy as np
import tensorflow as tf


@dataclasses.dataclass
class PyDatasetSource:
    """A `PyDataset`; `first_sample` (item 0's) is the padding."""

    py_dataset: object
    item_sizes: tuple
    signature: object
    first_sample: object
    first_item_text: str
    kind, unit, default_shuffle = "keras.utils.PyDataset", "items", False
    batch_size = property(lambda self: self.item_sizes[0])
    num_examples = property(lambda self: sum(self.item_sizes))
    num_files = property(lambda self: len(self.item_sizes))
    file_sizes = property(lambda self: self.item_sizes)
    notes = property(
        lambda self: (
            f"{self.num_examples} samples from len() = {len(self.item_sizes)} items of {self.batch_size}, the last with {self.item_sizes[-1]}",
        )
    )


def as_fit_layout(item):
    """`item` as a tuple `(x,)`, `(x, y)` or `(x, y, sample_weight)`, without trailing `None`s."""
    if not isinstance(item, tuple):
        return (item,)
    item = tuple(item)
    while item and item[-1] is None:
        item = item[:-1]
    return item


def unpack(element):
    """A one-part element as that part, else as it is."""
    return element[0] if len(element) == 1 else element


def _describe(item):
    shapes = [tf.nest.map_structure(lambda leaf: tuple(np.shape(leaf)), part) for part in item]
    return "(" + ", ".join(f"{n}: {s}" for n, s in zip(("x", "y", "sample_weight"), shapes)) + ")"


def _signature(item, index):
    def spec(leaf):
        tensor = tf.convert_to_tensor(leaf)
        if tensor.shape.rank == 0:
            raise ValueError(
                f"PyDataset item {index} holds a scalar ({_describe(item)}): each item must be a batch, whose arrays have a first dimension of samples."
            )
        return tf.TensorSpec([None] + tensor.shape.as_list()[1:], tensor.dtype)

    return tf.nest.map_structure(spec, item)


def check_item(item, index, signature, expected_size, first_item_text):
    """`item` as `(x, y, ...)`; ValueError unless it matches item 0 with `expected_size` samples."""
    item = as_fit_layout(item)
    mismatch = None
    try:
        tf.nest.assert_same_structure(signature, item)
    except (ValueError, TypeError) as error:
        mismatch = f"its structure differs ({error})"
    for spec, leaf in zip(tf.nest.flatten(signature), tf.nest.flatten(item)):
        if mismatch is not None:
            break
        shape = tuple(np.shape(leaf))
        if not shape or not spec.shape[1:].is_compatible_with(shape[1:]):
            mismatch = f"a sample shape differs ({shape[1:]} against {tuple(spec.shape[1:])})"
        elif shape[0] != expected_size:
            mismatch = f"it has {shape[0]} samples where {expected_size} are expected (every item but the last must be a full batch of item 0's size)"
    if mismatch is not None:
        raise ValueError(
            f"PyDataset item {index} does not match item 0: {mismatch}. Item 0 is {first_item_text} and item {index} is {_describe(item)}. Every item must have item 0's structure and sample shapes, and every item but the last its number of samples."
        )
    return item


def inspect_py_dataset(py_dataset, num_samples=None):
    """A `PyDatasetSource` from items 0 and `len - 1` alone: `(len - 1) * batch + last` samples."""
    try:
        num_items = py_dataset.num_batches
    except NotImplementedError:
        num_items = None
    if num_items is None:
        raise ValueError(
            "data is a PyDataset without a length (num_batches is None), but distribute() needs the number of items to give every worker the same steps: implement __len__ (or num_batches)."
        )
    num_items = int(num_items)
    if num_items == 0:
        raise ValueError("data is an empty PyDataset: there is nothing to train on.")
    first = as_fit_layout(py_dataset[0])
    signature = _signature(first, 0)
    batch_size = int(np.shape(tf.nest.flatten(first)[0])[0])
    first_text = _describe(first)
    check_item(first, 0, signature, batch_size, first_text)
    last_size = batch_size
    if num_items > 1:
        last = as_fit_layout(py_dataset[num_items - 1])
        last_size = int(np.shape(tf.nest.flatten(last)[0])[0]) if tf.nest.flatten(last) else 0
        check_item(last, num_items - 1, signature, last_size, first_text)
    item_sizes = (batch_size,) * (num_items - 1) + (last_size,)
    total = sum(item_sizes)
    if num_samples is not None and num_samples != total:
        raise ValueError(
            f"num_samples={num_samples} contradicts the PyDataset: {num_items} items of {batch_size} samples, the last with {last_size}, hold {total}. Leave num_samples out; it is counted from len() and the last item."
        )
    first_sample = unpack(tf.nest.map_structure(lambda leaf: np.asarray(leaf)[0], first))
    return PyDatasetSource(py_dataset, item_sizes, signature, first_sample, first_text)


def sample_stream(source, item_indices, shuffle, seed, pass_index):
    """The samples of the given items in pass `pass_index` (a tensor), shuffled by `seed` and it."""
    # on_epoch_begin and on_epoch_end come in pairs: a pass given up early (the
    # batch fit reads to build the model) ends no epoch, and the next begins none.
    in_epoch = [False]

    def generate(pass_index):
        order = item_indices
        if shuffle:
            rng = np.random.default_rng([seed, int(pass_index)])
            order = rng.permutation(item_indices).tolist()
        py_dataset = source.py_dataset
        if not in_epoch[0]:
            in_epoch[0] = True
            py_dataset.on_epoch_begin()
        for index, item in _read_items(py_dataset, order):
            size = source.item_sizes[index]
            yield check_item(item, index, source.signature, size, source.first_item_text)
        in_epoch[0] = False
        py_dataset.on_epoch_end()

    batches = tf.data.Dataset.from_generator(
        generate, args=(pass_index,), output_signature=source.signature
    )
    return batches.unbatch().map(lambda *element: unpack(element))


_shared_py_dataset: Any = None


def _share(py_dataset):
    global _shared_py_dataset
    _shared_py_dataset = py_dataset


def _shared_item(index):
    return _shared_py_dataset[index]


def _read_items(py_dataset, order):
    """`(index, item)` in `order`, read ahead by the dataset's `workers`, as `fit` does."""
    workers = max(py_dataset.workers or 1, 1)
    if workers == 1 and not py_dataset.use_multiprocessing:
        yield from ((index, py_dataset[index]) for index in order)
        return
    if py_dataset.use_multiprocessing:
        pool: concurrent.futures.Executor = concurrent.futures.ProcessPoolExecutor(
            workers, initializer=_share, initargs=(py_dataset,)
        )
        read = _shared_item
    else:
        pool, read = concurrent.futures.ThreadPoolExecutor(workers), py_dataset.__getitem__
    remaining = iter(order)
    try:
        queue_size = max(py_dataset.max_queue_size or 1, 1)
        pending = collections.deque(
            (index, pool.submit(read, index)) for index in itertools.islice(remaining, queue_size)
        )
        while pending:
            index, future = pending.popleft()
            for following in itertools.islice(remaining, 1):
                pending.append((following, pool.submit(read, following)))
            yield index, future.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
