"""Fingerprints of tensors that change whenever one element's bits change.

A fingerprint is one int64 number computed on the tensor's own device: the
tensor's bytes read as 64-bit words and summed modulo 2**64 (tensors whose
byte count is not a multiple of 8 are widened element by element instead).

Any change of a single element, even by one ulp, changes a single word by
`d * 2**k` with `0 < |d| < 2**(64 - k)`, which is never a multiple of 2**64:
so it always changes the sum. Changes of several elements change it unless
their bit differences cancel exactly in the sum. The sum does not depend on
where each word sits, so a permutation of the words (two values trading
places) is not seen: weighting words by their position would catch it but
costs three to four times as much (measured on CPU), and the divergences met
in training change values, not their order.

One pass over memory per tensor with one integer reduction and no copy, so
it costs about as much as `tf.reduce_sum` of the tensor, much less than
copying it to the host. NaN and Inf are bit patterns like any other: a NaN
on one replica changes its fingerprint.
"""

import numpy as np
import tensorflow as tf

_SAME_SIZE_INT = {1: tf.int8, 2: tf.int16, 4: tf.int32, 8: tf.int64}


class _SharedConstants:
    """Graph constants shared by all fingerprints of one function.

    A model has hundreds of variables and every replica fingerprints each of
    them: sharing the shape and axis constants keeps the function's graph,
    and so the time to trace and optimise it, about half as large.
    """

    def __init__(self):
        self._constants = {}

    def __call__(self, value):
        if value not in self._constants:
            self._constants[value] = tf.constant(value, tf.int32)
        return self._constants[value]


def _words(tensor, constants):
    """The tensor's bits as int64 words whose sum is the fingerprint."""
    if tensor.dtype == tf.bool:
        tensor = tf.cast(tensor, tf.uint8)
    itemsize = tensor.dtype.size
    num_elements = tensor.shape.num_elements()
    if num_elements is not None and itemsize <= 8 and (num_elements * itemsize) % 8 == 0:
        # Viewing the bytes as int64 words costs no copy.
        per_word = 8 // itemsize
        if per_word == 1:
            flat = tf.reshape(tensor, constants((-1,)))
            return flat if flat.dtype == tf.int64 else tf.bitcast(flat, tf.int64)
        return tf.bitcast(tf.reshape(tensor, constants((-1, per_word))), tf.int64)
    flat = tf.reshape(tensor, constants((-1,)))
    if itemsize > 8:
        return tf.reshape(tf.bitcast(flat, tf.int64), constants((-1,)))
    same_size_int = _SAME_SIZE_INT[itemsize]
    if flat.dtype != same_size_int:
        flat = tf.bitcast(flat, same_size_int)
    return tf.cast(flat, tf.int64)


def _fingerprint(tensor, constants):
    return tf.reduce_sum(_words(tf.convert_to_tensor(tensor), constants), constants(0))


def fingerprint(tensor):
    """The fingerprint of a tensor: an int64 scalar (see the module docstring)."""
    return _fingerprint(tensor, _SharedConstants())


def fingerprint_table(tensors):
    """The fingerprints of `tensors` as an int64 vector `[len(tensors)]`."""
    if not tensors:
        return tf.zeros([0], tf.int64)
    constants = _SharedConstants()
    return tf.stack([_fingerprint(tensor, constants) for tensor in tensors])


def fingerprint_numpy(array):
    """The same fingerprint computed with NumPy on the host (a reference)."""
    array = np.asarray(array)
    if array.dtype == np.bool_:
        array = array.astype(np.uint8)
    raw = np.ascontiguousarray(array).reshape(-1)
    if raw.nbytes % 8 == 0:
        words = raw.view(np.int64)
    else:
        words = raw.view(f"i{array.dtype.itemsize}").astype(np.int64)
    return np.int64(words.sum(dtype=np.uint64).astype(np.int64))
