"""Builds the tf.data pipeline that carries out an input plan."""

import functools

import tensorflow as tf

from keras_scaling.data import _passes, _py_dataset, _sources

# A buffer of every record would not fit in memory (arrays get a full permutation instead).
SHUFFLE_BUFFER_ELEMENTS = 10_000


def build(
    source, plan, schedule, file_assignment, parse_fn, cache, prefetch_batches=None, **threading
):
    """This worker's batched, prefetched dataset; `threading`: `tf.data.Options().threading`'s."""
    counter = _passes.PassCounter()
    if isinstance(source, _sources.ArraySource) and parse_fn is None:
        dataset = _batched_array_rows(source, plan, schedule, counter, cache)
    else:
        dataset = _parsed_batches(source, plan, schedule, file_assignment, parse_fn, cache, counter)
    # "partial" runs on one worker only.
    batches = tf.data.experimental.assert_cardinality(schedule.steps_per_epoch // plan.num_workers)
    dataset = dataset.apply(batches)
    options = tf.data.Options()
    # The split between workers is done above; TensorFlow must not split again
    # (AUTO would read every file on every worker: tensorflow#49048).
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    for name, value in threading.items():
        if value is not None:
            setattr(options.threading, name, value)
    dataset = dataset.with_options(options).prefetch(prefetch_batches or tf.data.AUTOTUNE)
    setattr(dataset, _passes.COUNTER_ATTRIBUTE, counter)
    return dataset


def _shuffle(dataset, plan, buffer_size, pass_index):
    """`dataset` in the order of pass `pass_index`, whatever TensorFlow's global seed."""
    # TensorFlow's check of a global seed of 0 against the op's seed would read this tensor as a bool.
    seed = _passes.pass_seed(plan.seed, pass_index)
    graph = tf.compat.v1.get_default_graph()
    global_seed, graph.seed = graph.seed, None
    try:
        return dataset.shuffle(buffer_size, seed=seed, reshuffle_each_iteration=False)
    finally:
        graph.seed = global_seed


def _shuffled_in_each_pass(dataset, plan, buffer_size, counter):
    return _passes.each_pass(counter, lambda index: _shuffle(dataset, plan, buffer_size, index))


def _batched_array_rows(source, plan, schedule, counter, cache):
    """Shuffles, shards and pads row indices (-1: a padding row), then gathers whole batches.

    Unshuffled, every pass gathers the same batches: `cache` keeps them. Shuffled,
    the rows are in memory already and the batches differ in each pass.
    """
    positions = tf.data.Dataset.range(source.num_examples)
    if plan.shuffle:
        positions = _shuffled_in_each_pass(positions, plan, source.num_examples, counter)
    if plan.num_workers > 1:
        positions = positions.shard(plan.num_workers, plan.worker_index)
    positions = _keep_or_pad(positions, schedule, plan, tf.data.Dataset.range(-1, 0))
    positions = positions.batch(plan.global_batch_size, drop_remainder=plan.last_batch != "partial")

    def gather(indices):
        rows = tf.nest.map_structure(lambda a: tf.gather(a, tf.maximum(indices, 0)), source.arrays)
        if plan.last_batch != "pad":
            return rows
        return _with_padding_weights(rows, tf.cast(indices >= 0, tf.float32))

    batches = positions.map(gather, num_parallel_calls=tf.data.AUTOTUNE)
    if cache and not plan.shuffle:
        return batches.cache() if cache is True else batches.cache(str(cache))
    return batches


def _keep_or_pad(stream, schedule, plan, padding, read_to_end=False):
    """This worker's samples, then padding; `read_to_end` reads the dropped samples too."""
    if plan.last_batch == "drop":
        kept = schedule.examples_per_worker[plan.worker_index]
        if not read_to_end:
            return stream.take(kept)
        numbered = stream.enumerate().filter(lambda position, _: position < kept)
        return numbered.map(lambda _, element: element)
    if plan.last_batch == "pad":
        stream = stream.concatenate(padding.repeat(schedule.padding_per_worker[plan.worker_index]))
    return stream


def _parsed_batches(source, plan, schedule, file_assignment, parse_fn, cache, counter):
    """Shards and shuffles raw elements, then parses this worker's share only."""
    load = _loader(source, parse_fn)
    raw, raw_size = _raw_elements(source, plan, file_assignment)
    raw_of_pass = raw if callable(raw) else lambda pass_index: raw
    first_pass = tf.constant(0, tf.int64)
    buffer_size = min(raw_size, SHUFFLE_BUFFER_ELEMENTS)
    if plan.shuffle and not cache:
        # The same order of the whole data on every worker, each keeping its positions.
        stream = _passes.each_pass(
            counter, lambda index: _shuffle(raw_of_pass(index), plan, buffer_size, index)
        )
    else:
        stream = raw_of_pass(first_pass)
    if plan.shard_mode == "element":
        stream = stream.shard(plan.num_workers, plan.worker_index)
    stream = stream.map(load, num_parallel_calls=tf.data.AUTOTUNE)
    if cache:
        # A cache replays pass 0: the split is fixed, and each worker shuffles its own share.
        stream = stream.cache() if cache is True else stream.cache(str(cache))
        if plan.shuffle:
            stream = _shuffled_in_each_pass(stream, plan, buffer_size, counter)
    padded, padding = plan.last_batch == "pad", None
    if padded:
        stream = stream.map(lambda *element: (_py_dataset.unpack(element), 1.0))
        # A PyDataset's first sample: reading the stream would start a pass (on_epoch_begin).
        if isinstance(source, _py_dataset.PyDatasetSource):
            first = tf.data.Dataset.from_tensors(source.first_sample)
        else:
            first = raw_of_pass(first_pass).take(1).map(load)
        padding = first.map(lambda *element: (_py_dataset.unpack(element), 0.0))
    # A PyDataset ends its epoch, and tf.data keeps a cache, only once read to the end.
    read_to_end = isinstance(source, _py_dataset.PyDatasetSource) or bool(cache)
    stream = _keep_or_pad(stream, schedule, plan, padding, read_to_end=read_to_end)
    stream = stream.batch(plan.global_batch_size, drop_remainder=plan.last_batch != "partial")
    if padded:
        stream = stream.map(_with_padding_weights)
    return stream


def _raw_elements(source, plan, file_assignment):
    """`(elements, count)`: this worker's unparsed elements, a dataset or a function of the pass."""
    if isinstance(source, _sources.ArraySource):
        return tf.data.Dataset.from_tensor_slices(source.arrays), source.num_examples
    if isinstance(source, _sources.DatasetSource):
        return source.dataset, source.num_examples
    own = None if file_assignment is None else file_assignment[plan.worker_index]
    if isinstance(source, _sources.DirectorySource):
        if own is not None:
            return _select(source.files, source.positions_of(own), source.num_files)
        files = _in_path_order(source) if plan.shard_mode == "element" else source.files
        return files, source.num_examples
    own = range(source.num_files) if own is None else own
    count = sum(source.file_sizes[index] for index in own)
    if isinstance(source, _py_dataset.PyDatasetSource):
        read = functools.partial(_py_dataset.sample_stream, source, own, plan.shuffle, plan.seed)
        return read, count
    paths = [source.paths[index] for index in own]
    files = tf.data.Dataset.from_tensor_slices(paths)

    def records_of_pass(pass_index):
        ordered = files
        if plan.shuffle and len(paths) > 1:
            ordered = _shuffle(files, plan, len(paths), pass_index)
        return ordered.interleave(
            tf.data.TFRecordDataset,
            cycle_length=min(len(paths), 8),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )

    return records_of_pass, count


def _in_path_order(source):
    """A directory utility's files by path: without a `seed` it lists them in a random order."""
    elements = sorted(source.files.as_numpy_iterator(), key=lambda e: tf.nest.flatten(e)[0])
    columns = tf.nest.map_structure(
        lambda spec, *column: tf.constant(list(column), spec.dtype),
        source.files.element_spec,
        *elements,
    )
    return tf.data.Dataset.from_tensor_slices(columns)


def _select(elements, positions, num_elements):
    chosen = set(positions)
    keep = tf.constant([position in chosen for position in range(num_elements)])
    chosen = elements.enumerate().filter(lambda position, _: keep[position]).map(lambda _, e: e)
    return chosen.apply(tf.data.experimental.assert_cardinality(len(positions))), len(positions)


def _loader(source, parse_fn):
    """One raw element to a sample: the source's decoders (a directory utility's), then `parse_fn`."""
    decoders = getattr(source, "decoders", ())

    def load(*element):
        for decoder in decoders:
            element = decoder(*element)
            element = element if isinstance(element, tuple) else (element,)
        sample = _py_dataset.unpack(element)
        return sample if parse_fn is None else parse_fn(sample)

    return load


def _with_padding_weights(element, weights):
    """The 0/1 padding weights as `sample_weight`, times any given; `x` alone has no loss."""
    if not isinstance(element, tuple) or len(element) < 2:
        return element
    if len(element) == 2:
        return element + (weights,)
    x, y, sample_weight = element

    def merge(given):
        given = tf.convert_to_tensor(given)
        shape = tf.concat([tf.shape(weights), tf.ones([given.shape.rank - 1], tf.int32)], 0)
        return given * tf.cast(tf.reshape(weights, shape), given.dtype)

    return x, y, tf.nest.map_structure(merge, sample_weight)
