"""Counts the samples of a dataset whose length is not known, in one pass.

Only the number of samples of each element is kept (a scalar per element,
summed in chunks), so nothing but the reading and decoding upstream costs
time. Before the count goes on, the time it will take is logged, measured on
its first chunk; a progress bar shows the rest.
"""

import logging
import time

import keras
import numpy as np
import tensorflow as tf

logger = logging.getLogger("keras_scaling")

# Elements whose counts are summed on the device before one reaches Python.
COUNT_CHUNK_ELEMENTS = 1024
# How long the first chunks are timed before the estimate is logged.
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
    """The time left to read `elements_total` at the pace of the first ones.

    For example, 1024 of 10 240 elements read in 2 s leave about 18 s.
    Returns None when the total is unknown (negative or None).
    """
    if elements_total is None or elements_total < 0 or elements_read == 0:
        return None
    return elapsed_s / elements_read * max(elements_total - elements_read, 0)


def count_samples(dataset, *, batched, what="data"):
    """Reads `dataset` once and returns its number of samples.

    Args:
        dataset: a finite `tf.data.Dataset`.
        batched: whether each element is a batch (then its first dimension is
            counted) or one sample.
        what: how to name the data in the messages.

    Returns:
        int, the samples in one pass.
    """
    elements_total = int(dataset.cardinality())
    counts = dataset.map(
        lambda *element: samples_in(element[0] if len(element) == 1 else element, batched),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    chunks = counts.batch(COUNT_CHUNK_ELEMENTS).map(
        lambda sizes: (tf.reduce_sum(sizes), tf.size(sizes, out_type=tf.int64))
    )
    total_target = elements_total if elements_total >= 0 else None
    logger.info(
        "Counting the samples of %s: its length is not known, so it is read once "
        "(pass num_samples= to skip this); the expected time is logged after %.0f s.",
        what,
        ESTIMATE_AFTER_S,
    )
    start = time.perf_counter()
    samples = elements = 0
    progress = None
    announced = False
    for chunk_samples, chunk_elements in chunks.as_numpy_iterator():
        samples += int(chunk_samples)
        elements += int(chunk_elements)
        elapsed_s = time.perf_counter() - start
        if not announced and elapsed_s >= ESTIMATE_AFTER_S:
            announced = True
            _announce(what, elapsed_s, elements, elements_total, samples)
            progress = keras.utils.Progbar(total_target, unit_name="element")
        if progress is not None:
            progress.update(elements)
    if progress is not None and total_target is None:
        progress.update(elements, finalize=True)
    logger.info(
        "Counted %d samples in %s in %.1f s (pass num_samples=%d to skip the count).",
        samples,
        what,
        time.perf_counter() - start,
        samples,
    )
    return int(np.int64(samples))


def _announce(what, elapsed_s, elements, elements_total, samples):
    left_s = estimated_seconds(elapsed_s, elements, elements_total)
    pace = samples / elapsed_s
    if left_s is None:
        logger.warning(
            "Counting the samples of %s by reading it once (its length is not "
            "known): %d so far, %.0f samples/s, total unknown. Pass "
            "num_samples= to skip this.",
            what,
            samples,
            pace,
        )
    else:
        logger.warning(
            "Counting the samples of %s by reading it once (its length is not "
            "known): about %.0f s more at %.0f samples/s. Pass num_samples= to "
            "skip this.",
            what,
            left_s,
            pace,
        )
