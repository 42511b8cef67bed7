"""Fingerprints of tensors that change whenever one element's bits change.

A fingerprint is two int64 numbers computed on the tensor's own device:

- `word_sum`: the tensor's bytes read as 64-bit words and summed modulo 2**64
  (tensors whose byte count is not a multiple of 8 are widened element by
  element instead). Any change of a single element, even by one ulp, changes
  a single word by `d * 2**k` with `0 < |d| < 2**(64 - k)`, which is never a
  multiple of 2**64: so it always changes the sum. Changes of several
  elements change it unless their bit differences cancel exactly in the sum.
  The sum does not depend on where each word sits, so a permutation of the
  words (two values trading places) is not seen: weighting words by their
  position would catch it but costs three to four times as much (measured
  on CPU), and the divergences met in training change values, not their
  order.
- `non_finite`: 1 when the float sum of the tensor is NaN or Inf (some element
  is NaN or Inf, or the sum overflows), else 0. It only flags a variable for
  an exact NaN/Inf count on the host; it is never compared for equality,
  since float sums need not be reproducible across devices.

One pass over memory per tensor with one integer reduction, so it costs about
as much as `tf.reduce_sum` of the tensor and much less than copying it.
"""

import numpy as np
import tensorflow as tf

FIELDS = ("word_sum", "non_finite")
WORD_SUM, NON_FINITE = 0, 1

_SAME_SIZE_INT = {1: tf.int8, 2: tf.int16, 4: tf.int32, 8: tf.int64}


def _words(tensor):
    """The tensor's bits as a flat int64 vector whose sum is the fingerprint."""
    if tensor.dtype == tf.bool:
        tensor = tf.cast(tensor, tf.uint8)
    itemsize = tensor.dtype.size
    num_elements = tensor.shape.num_elements()
    flat = tf.reshape(tensor, [-1])
    if num_elements is not None and (num_elements * itemsize) % 8 == 0:
        # Viewing the bytes as int64 words costs no copy.
        as_bytes = tf.bitcast(flat, tf.uint8) if itemsize > 1 else flat
        return tf.bitcast(tf.reshape(as_bytes, [-1, 8]), tf.int64)
    if itemsize > 8:
        return tf.reshape(tf.bitcast(flat, tf.int64), [-1])
    same_size_int = _SAME_SIZE_INT[itemsize]
    if flat.dtype != same_size_int:
        flat = tf.bitcast(flat, same_size_int)
    return tf.cast(flat, tf.int64)


def fingerprint(tensor):
    """The `[word_sum, non_finite]` fingerprint of a tensor, as int64 `[2]`."""
    tensor = tf.convert_to_tensor(tensor)
    word_sum = tf.reduce_sum(_words(tensor))
    if tensor.dtype.is_floating or tensor.dtype.is_complex:
        total = tf.reduce_sum(tensor)
        if tensor.dtype.is_complex:
            total = tf.abs(total)
        non_finite = tf.cast(tf.logical_not(tf.math.is_finite(total)), tf.int64)
    else:
        non_finite = tf.constant(0, tf.int64)
    return tf.stack([word_sum, non_finite])


def fingerprint_table(tensors):
    """Stacks the fingerprints of `tensors` into an int64 `[len(tensors), 2]`."""
    if not tensors:
        return tf.zeros([0, len(FIELDS)], tf.int64)
    return tf.stack([fingerprint(tensor) for tensor in tensors])


def fingerprint_numpy(array):
    """The same fingerprint computed with NumPy on the host (a reference)."""
    array = np.ascontiguousarray(array)
    if array.dtype == np.bool_:
        array = array.astype(np.uint8)
    raw = array.reshape(-1)
    if raw.nbytes % 8 == 0:
        words = raw.view(np.int64)
    else:
        words = raw.view(f"i{array.dtype.itemsize}").astype(np.int64)
    word_sum = int(words.sum(dtype=np.uint64).astype(np.int64))
    non_finite = 0
    if np.issubdtype(array.dtype, np.inexact) or array.dtype.name == "bfloat16":
        with np.errstate(over="ignore", invalid="ignore"):
            non_finite = int(not np.isfinite(array.astype(np.float64).sum()))
    return np.array([word_sum, non_finite], dtype=np.int64)
