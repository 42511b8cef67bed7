"""Counts the samples of a dataset of unknown length in one pass, with a progress bar after 1 s."""

import logging
import time

import keras
import tensorflow as tf

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
    if isinstance(first, tf.RaggedTensor):
        return tf.cast(first.nrows(), tf.int64)
    return tf.cast(tf.shape(first)[0], tf.int64)


def estimated_seconds(elapsed_s, elements_read, elements_total):
    """The time left at the pace so far (1024 of 10 240 in 2 s leave 18 s), or None."""
    if elements_total is None or elements_total < 0 or elements_read == 0:
        return None
    return elapsed_s / elements_read * max(elements_total - elements_read, 0)


def count_samples(dataset, *, batched):
    """Reads a finite `dataset` once; returns its samples (elements, or their first dimensions)."""
    elements_total = int(dataset.cardinality())
    counts = dataset.map(
        lambda *element: samples_in(element[0] if len(element) == 1 else element, batched),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    chunks = counts.batch(COUNT_CHUNK_ELEMENTS).map(
        lambda sizes: (tf.reduce_sum(sizes), tf.size(sizes, out_type=tf.int64))
    )
    start = time.perf_counter()
    samples = elements = 0
    progress = None
    for chunk_samples, chunk_elements in chunks.as_numpy_iterator():
        samples, elements = samples + int(chunk_samples), elements + int(chunk_elements)
        elapsed_s = time.perf_counter() - start
        if progress is None and elapsed_s >= ESTIMATE_AFTER_S:
            left_s = estimated_seconds(elapsed_s, elements, elements_total)
            left = "total unknown" if left_s is None else f"about {left_s:.0f} s more"
            logger.warning(
                "Counting the samples of data by reading it once (its length is not known): %s at %.0f samples/s. Pass num_samples= to skip this.",
                left,
                samples / elapsed_s,
            )
            target = elements_total if elements_total >= 0 else None
            progress = keras.utils.Progbar(target, unit_name="element")
        if progress is not None:
            progress.update(elements)
    if progress is not None and progress.target is None:
        progress.update(elements, finalize=True)
    logger.info(
        "Counted %d samples in data in %.1f s (pass num_samples=%d to skip the count).",
        samples,
        time.perf_counter() - start,
        samples,
    )
    return samples
