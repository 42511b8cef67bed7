"""Builds the tf.data pipeline that carries out an input plan."""

import tensorflow as tf

from keras_scaling.data import _passes, _py_dataset, _sources

# Datasets and records are shuffled through a buffer of at most this many
# elements (arrays get a full permutation of their row indices instead): a
# buffer holding every record of a large data set would not fit in memory.
SHUFFLE_BUFFER_ELEMENTS = 10_000


def build(
    source,
    *,
    plan,
    schedule,
    file_assignment,
    parse_fn,
    cache,
    counter,
    prefetch_batches=None,
    private_threadpool_size=None,
    max_intra_op_parallelism=None,
):
    """Returns the batched, prefetched dataset for this worker.

    `prefetch_batches` (None: AUTOTUNE) and the threading options change
    only how fast batches come.

    With shuffling, each pass (epoch) takes its number from `counter` (a
    `PassCounter`) when its first element is read, and its order depends on
    the seed and that number only. Only the shuffle is built again for each
    pass; what follows it is built once.
    """
    if isinstance(source, _sources.ArraySource) and parse_fn is None:
        dataset = _batched_array_rows(source, plan, schedule, counter)
    else:
        dataset = _batched_elements(
            source, plan, schedule, file_assignment, parse_fn, cache, counter
        )
    dataset = dataset.apply(
        tf.data.experimental.assert_cardinality(_batches_per_worker(plan, schedule))
    )
    options = tf.data.Options()
    # The split between workers is done above; TensorFlow must not split again
    # (AUTO would read every file on every worker: tensorflow#49048).
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if private_threadpool_size is not None:
        options.threading.private_threadpool_size = private_threadpool_size
    if max_intra_op_parallelism is not None:
        options.threading.max_intra_op_parallelism = max_intra_op_parallelism
    buffer_size = tf.data.AUTOTUNE if prefetch_batches is None else prefetch_batches
    return dataset.with_options(options).prefetch(buffer_size)


def _batches_per_worker(plan, schedule):
    if plan.last_batch == "partial":
        return schedule.steps_per_epoch
    return schedule.steps_per_epoch // plan.num_workers


def _drop_remainder(plan):
    return plan.last_batch != "partial"


def _shuffle(dataset, plan, buffer_size, pass_index):
    """`dataset` in the order of pass `pass_index`, whatever TensorFlow's global seed.

    The graph's seed (`tf.random.set_seed`) is set aside while the shuffle is
    made: the order is the plan's seed's alone, and TensorFlow's check of a
    global seed of 0 against the op's seed would read this tensor as a bool.
    """
    seed = _passes.pass_seed(plan.seed, pass_index)
    graph = tf.compat.v1.get_default_graph()
    global_seed, graph.seed = graph.seed, None
    try:
        return dataset.shuffle(buffer_size, seed=seed, reshuffle_each_iteration=False)
    finally:
        graph.seed = global_seed


def _shuffled_in_each_pass(dataset, plan, buffer_size, counter):
    """`dataset` shuffled anew in each pass, in the order of the pass's number."""
    return _passes.each_pass(
        counter, lambda pass_index: _shuffle(dataset, plan, buffer_size, pass_index)
    )


def _batched_array_rows(source, plan, schedule, counter):
    """Shuffles, shards and pads row indices, then gathers whole batches.

    Index `-1` marks a padding row: it gathers row 0 and gets weight 0.
    """
    positions = tf.data.Dataset.range(source.num_examples)
    if plan.shuffle:
        positions = _shuffled_in_each_pass(positions, plan, source.num_examples, counter)
    if plan.num_workers > 1:
        positions = positions.shard(plan.num_workers, plan.worker_index)
    positions = _keep_or_pad(
        positions,
        schedule,
        plan,
        padding=tf.data.Dataset.from_tensors(tf.constant(-1, tf.int64)),
    )
    positions = positions.batch(plan.global_batch_size, drop_remainder=_drop_remainder(plan))
    arrays = source.arrays
    padded = plan.last_batch == "pad"

    def gather(indices):
        rows = tf.nest.map_structure(lambda array: tf.gather(array, tf.maximum(indices, 0)), arrays)
        if not padded:
            return rows
        return _with_padding_weights(rows, tf.cast(indices >= 0, tf.float32))

    return positions.map(gather, num_parallel_calls=tf.data.AUTOTUNE)


def _keep_or_pad(stream, schedule, plan, padding, read_to_end=False):
    """Cuts the stream to this worker's real samples, then appends padding.

    With `read_to_end`, the samples dropped are still read (and skipped), so
    that the source reaches its end every epoch: a `PyDataset` calls
    `on_epoch_end` there.
    """
    if plan.last_batch == "drop":
        kept = schedule.examples_per_worker[plan.worker_index]
        if not read_to_end:
            return stream.take(kept)
        numbered = stream.enumerate().filter(lambda position, _: position < kept)
        return numbered.map(lambda _, element: element)
    if plan.last_batch == "pad":
        count = schedule.padding_per_worker[plan.worker_index]
        if count:
            stream = stream.concatenate(padding.repeat(count))
    return stream


def _batched_elements(source, plan, schedule, file_assignment, parse_fn, cache, counter):
    """Shards and shuffles raw elements, then parses only this worker's share."""
    load = _loader(source, parse_fn)
    element_sharded = plan.shard_mode == "element"
    raw_of_pass, raw_size = _raw_elements(source, plan, file_assignment)
    buffer_size = min(raw_size, SHUFFLE_BUFFER_ELEMENTS)
    if cache:
        # A cache replays its first pass, so the split between workers is
        # fixed here (the files in the order of pass 0) and each worker
        # shuffles its own share after the cache, anew in each pass.
        stream = raw_of_pass(None)
        if element_sharded:
            stream = stream.shard(plan.num_workers, plan.worker_index)
        stream = stream.map(load, num_parallel_calls=tf.data.AUTOTUNE)
        stream = stream.cache() if cache is True else stream.cache(str(cache))
        if plan.shuffle:
            stream = _shuffled_in_each_pass(stream, plan, buffer_size, counter)
    else:
        # Every worker draws the same order of the whole data and keeps its
        # own positions, so together they read each sample once per epoch.
        if not plan.shuffle:
            stream = raw_of_pass(None)
        else:

            def raw_in_order_of_pass(pass_index):
                return _shuffle(raw_of_pass(pass_index), plan, buffer_size, pass_index)

            stream = _passes.each_pass(counter, raw_in_order_of_pass)
        if element_sharded:
            stream = stream.shard(plan.num_workers, plan.worker_index)
        stream = stream.map(load, num_parallel_calls=tf.data.AUTOTUNE)
    padded = plan.last_batch == "pad"
    padding = None
    if padded:
        stream = stream.map(lambda *element: (_unpack(element), 1.0))
        padding = _first_sample(source, raw_of_pass, load).map(
            lambda *element: (_unpack(element), 0.0)
        )
    stream = _keep_or_pad(
        stream,
        schedule,
        plan,
        padding,
        read_to_end=isinstance(source, _py_dataset.PyDatasetSource),
    )
    stream = stream.batch(plan.global_batch_size, drop_remainder=_drop_remainder(plan))
    if padded:
        stream = stream.map(_with_padding_weights)
    return stream


def _first_sample(source, raw_of_pass, load):
    """One sample to copy as padding, read without starting another pass."""
    if isinstance(source, _py_dataset.PyDatasetSource):
        # Reading the stream would start a pass, and with it on_epoch_begin.
        return tf.data.Dataset.from_tensors(source.first_sample)
    return raw_of_pass(None).take(1).map(load)


def _unpack(element):
    return element[0] if len(element) == 1 else element


def _raw_elements(source, plan, file_assignment):
    """The unparsed elements this worker reads, and how many there are.

    Returns `(elements_of_pass, count)`: `elements_of_pass(pass_index)` is
    the dataset of the elements in pass `pass_index` (a tensor; None for the
    order of pass 0 built outside any pass). What does not depend on the
    pass is built here, once.
    """
    if isinstance(source, _sources.ArraySource):
        arrays = source.arrays
        positions = tf.data.Dataset.range(source.num_examples)
        rows = positions.map(
            lambda index: tf.nest.map_structure(lambda array: tf.gather(array, index), arrays)
        )
        return _same_in_every_pass(rows), source.num_examples
    if isinstance(source, _sources.DatasetSource):
        return _same_in_every_pass(source.dataset), source.num_examples
    if isinstance(source, _py_dataset.PyDatasetSource):
        items = (
            file_assignment[plan.worker_index]
            if plan.shard_mode == "item"
            else range(source.num_files)
        )

        def samples_of_pass(pass_index):
            return _py_dataset.sample_stream(
                source, items, shuffle=plan.shuffle, seed=plan.seed, pass_index=_or_0(pass_index)
            )

        return samples_of_pass, sum(source.item_sizes[index] for index in items)
    if isinstance(source, _sources.DirectorySource):
        if plan.shard_mode == "element":
            return _same_in_every_pass(_in_path_order(source)), source.num_examples
        if plan.shard_mode != "file":
            return _same_in_every_pass(source.files), source.num_examples
        positions = source.positions_of(file_assignment[plan.worker_index])
        selected, count = _select(source.files, positions, source.num_files)
        return _same_in_every_pass(selected), count
    if plan.shard_mode == "file":
        indices = file_assignment[plan.worker_index]
        paths = [source.paths[index] for index in indices]
        count = sum(source.file_sizes[index] for index in indices)
    else:
        paths, count = list(source.paths), source.num_examples
    files = tf.data.Dataset.from_tensor_slices(paths)

    def records_of_pass(pass_index):
        ordered = files
        if plan.shuffle and len(paths) > 1:
            ordered = _shuffle(files, plan, len(paths), _or_0(pass_index))
        return ordered.interleave(
            tf.data.TFRecordDataset,
            cycle_length=min(len(paths), 8),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )

    return records_of_pass, count


def _or_0(pass_index):
    return tf.constant(0, tf.int64) if pass_index is None else pass_index


def _same_in_every_pass(dataset):
    return lambda pass_index: dataset


def _in_path_order(source):
    """A directory utility's few files (fewer than workers), sorted by path.

    Element sharding keeps positions of one order that every worker must
    share; a utility without a `seed` lists the files in a random order.
    """
    elements = list(source.files.as_numpy_iterator())
    if not isinstance(elements[0], tuple):
        return tf.data.Dataset.from_tensor_slices(
            tf.constant(sorted(elements), source.files.element_spec.dtype)
        )
    elements.sort(key=lambda element: element[0])
    columns = [
        tf.constant(list(column), spec.dtype)
        for column, spec in zip(zip(*elements), source.files.element_spec)
    ]
    return tf.data.Dataset.from_tensor_slices(tuple(columns))


def _select(elements, positions, num_elements):
    """The elements at `positions` (in their order), before any decoding."""
    keep = tf.scatter_nd(
        tf.constant([[position] for position in positions], tf.int64),
        tf.ones([len(positions)], tf.bool),
        [num_elements],
    )
    chosen = elements.enumerate().filter(lambda position, _: keep[position])
    chosen = chosen.map(lambda _, element: element)
    return chosen.apply(tf.data.experimental.assert_cardinality(len(positions))), len(positions)


def _loader(source, parse_fn):
    """The function from one raw element to a sample: the source's own
    decoders (a directory utility's file loading), then `parse_fn`."""
    decoders = getattr(source, "decoders", ())

    def load(*element):
        for decoder in decoders:
            element = decoder(*element)
            element = element if isinstance(element, tuple) else (element,)
        sample = _unpack(element)
        return sample if parse_fn is None else parse_fn(sample)

    return load


def _with_padding_weights(element, weights):
    """Adds the 0/1 padding weights as `sample_weight`, merging with any given.

    `(x, y)` becomes `(x, y, weights)`; in `(x, y, sample_weight)` the given
    weights are multiplied by them; data without targets (`x` alone) is
    returned unchanged, as there is no loss to weight.
    """
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
