"""Fingerprints of tensors that see a change of any one word, swaps and cancelling changes.

A fingerprint is one int64 number computed on the tensor's own device, in
one compiled function, with int64 arithmetic that wraps around modulo 2**64.
The tensor's bytes are read as 64-bit words `w[i]` (tensors whose byte count
is not a multiple of 8 are widened element by element instead), and each
word is weighted by an odd multiplier that depends on its position:

    fingerprint = sum over i of w[i] * (1 + 2 * G * i)     (modulo 2**64)

with `G` the odd constant 0x9E3779B97F4A7C15. That is the plain sum of the
words plus `2 * G` times the position-weighted sum `sum i * w[i]`. What it
guarantees, for a tensor of fewer than 2**32 words:

- Any change of one word changes it, always: a word changed by `d != 0`
  changes the sum by `d` times an odd number, never a multiple of 2**64. So
  one element (of up to 8 bytes), changed even by one ulp or turned to NaN,
  always changes it.
- Two words `i` and `j` trading places, or changing by `+k` and `-k` (which
  the plain sum of words this replaced could not see), change it by
  `2 * G * k * (i - j)`: always seen unless `k` (the difference of the two
  words' bit patterns) is a multiple of `2**(63 - t)`, where `2**t` is the
  largest power of two dividing `j - i`. For two words an odd distance
  apart that is only `k = 2**63` (words that differ in their top bit alone);
  for words at most 2**32 apart, `k` must be a multiple of 2**31 at least,
  so words whose low 31 bits differ are always seen.
- Other changes of several words change it unless their weighted
  differences sum to a multiple of 2**64. A fingerprint is 64 bits, so some
  different tensors share one: equal fingerprints do not prove equal copies
  beyond the cases above, they make a difference that escapes unlikely.

A mix of the words before the sum (as hash functions do) would leave no
exception but cost about ten times the plain sum on CPU. This weighting,
computed on a CPU as one product of the words (a row) with the multipliers
(a column, computed once per call for the longest tensor), costs 1.3 to
1.6 times the plain sum (1.6 for a ~1M-parameter MLP, 1.3 for ResNet50 with
Adam, on 2 logical CPUs: `benchmarks/replica_sync.py --fingerprints-only`);
on a GPU, which has no int64 matrix product, it is an elementwise product
and a sum, about twice the plain sum.
"""

import numpy as np
import tensorflow as tf

_SAME_SIZE_INT = {1: tf.int8, 2: tf.int16, 4: tf.int32, 8: tf.int64}

_G = 0x9E3779B97F4A7C15  # the odd 64-bit constant of Fibonacci hashing
# 2 * G modulo 2**64, as a signed int64 (TensorFlow's integer type).
_POSITION_STEP = ((2 * _G) % 2**64 + 2**63) % 2**64 - 2**63


class _SharedConstants:
    """Graph constants shared by all fingerprints of one function.

    A model has hundreds of variables and every replica fingerprints each of
    them: sharing the shape and axis constants keeps the function's graph,
    and so the time to trace and optimise it, about half as large.
    """

    def __init__(self):
        self._constants = {}

    def __call__(self, value, dtype=tf.int32):
        key = (value, dtype)
        if key not in self._constants:
            self._constants[key] = tf.constant(value, dtype)
        return self._constants[key]


def _words(tensor, constants):
    """The tensor's bits as a vector of int64 words."""
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


def _multiplier_column(num_words, constants):
    """The multipliers `1 + 2 * G * i` of positions 0 to `num_words - 1`, as a column."""
    positions = tf.range(num_words, dtype=tf.int64)
    multipliers = positions * constants(_POSITION_STEP, tf.int64) + constants(1, tf.int64)
    return tf.reshape(multipliers, constants((-1, 1)))


def _runs_on_cpu(tensor):
    """Whether the ops made from `tensor` run on a CPU (known when the function is traced)."""
    device_type = tf.DeviceSpec.from_string(tensor.device or "").device_type
    if device_type:
        return device_type.upper() == "CPU"
    return not tf.config.list_logical_devices("GPU") and not tf.config.list_logical_devices("TPU")


def _fingerprint(words, multiplier_column, constants):
    """The fingerprint of a word vector as a `[1, 1]` tensor."""
    if multiplier_column.shape[0] != words.shape[0]:
        # A leading slice shares the longer column's memory.
        multiplier_column = multiplier_column[: words.shape[0]]
    if _runs_on_cpu(words):
        # The words as a row times the multipliers as a column: one pass over
        # the words and no product tensor written, about 1.3 to 1.6 times the
        # plain sum where the product and sum below cost twice. GPUs have no
        # int64 matrix product.
        return tf.matmul(tf.reshape(words, constants((1, -1))), multiplier_column)
    products = words * tf.reshape(multiplier_column, constants((-1,)))
    return tf.reshape(tf.reduce_sum(products), constants((1, 1)))


def fingerprint(tensor):
    """The fingerprint of a tensor: an int64 scalar (see the module docstring)."""
    return fingerprint_table([tensor])[0]


def fingerprint_table(tensors):
    """The fingerprints of `tensors` as an int64 vector `[len(tensors)]`.

    The multipliers are computed once, for the longest tensor, and shared.
    """
    if not tensors:
        return tf.zeros([0], tf.int64)
    constants = _SharedConstants()
    word_vectors = [_words(tf.convert_to_tensor(tensor), constants) for tensor in tensors]
    lengths = [words.shape[0] for words in word_vectors]
    if any(length is None for length in lengths):
        products = [
            _fingerprint(
                words,
                _multiplier_column(tf.size(words, out_type=tf.int64), constants),
                constants,
            )
            for words in word_vectors
        ]
    else:
        column = _multiplier_column(max(lengths), constants)
        products = [_fingerprint(words, column, constants) for words in word_vectors]
    return tf.reshape(tf.concat(products, 0), constants((-1,)))


def fingerprint_numpy(array):
    """The same fingerprint computed with NumPy on the host (a reference)."""
    array = np.asarray(array)
    if array.dtype == np.bool_:
        array = array.astype(np.uint8)
    raw = np.ascontiguousarray(array).reshape(-1)
    if raw.nbytes % 8 == 0:
        words = raw.view(np.uint64)
    else:
        words = raw.view(f"i{array.dtype.itemsize}").astype(np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        multipliers = np.arange(words.size, dtype=np.uint64) * np.uint64(
            _POSITION_STEP % 2**64
        ) + np.uint64(1)
        return np.int64(np.sum(words * multipliers, dtype=np.uint64).astype(np.int64))
