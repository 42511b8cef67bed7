"""64-bit fingerprints of tensors on their own device: `sum of w[i] * (1 + 2 * G * i)` modulo
2**64, `w` the tensor's bytes as int64 words, `G` odd (the replica sync guide says what they see)."""

import tensorflow as tf

_SAME_SIZE_INT = {1: tf.int8, 2: tf.int16, 4: tf.int32, 8: tf.int64}

_G = 0x9E3779B97F4A7C15  # the odd 64-bit constant of Fibonacci hashing
# 2 * G modulo 2**64, as a signed int64 (TensorFlow's integer type).
_POSITION_STEP = ((2 * _G) % 2**64 + 2**63) % 2**64 - 2**63


class _SharedConstants(dict):
    """Graph constants shared by a function's fingerprints: it halves the graph, and its tracing time."""

    def __call__(self, value, dtype=tf.int32):
        if (value, dtype) not in self:
            self[(value, dtype)] = tf.constant(value, dtype)
        return self[(value, dtype)]


def _words(tensor, constants):
    if tensor.dtype == tf.bool:
        tensor = tf.cast(tensor, tf.uint8)
    itemsize = tensor.dtype.size
    num_elements = tensor.shape.num_elements()
    if num_elements is not None and itemsize <= 8 and (num_elements * itemsize) % 8 == 0:
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
    positions = tf.range(num_words, dtype=tf.int64)
    multipliers = positions * constants(_POSITION_STEP, tf.int64) + constants(1, tf.int64)
    return tf.reshape(multipliers, constants((-1, 1)))


def _runs_on_cpu(tensor):
    device_type = tf.DeviceSpec.from_string(tensor.device or "").device_type
    if device_type:
        return device_type.upper() == "CPU"
    return not tf.config.list_logical_devices("GPU") and not tf.config.list_logical_devices("TPU")


def _fingerprint(words, multiplier_column, constants):
    """The fingerprint of a word vector as a `[1, 1]` tensor."""
    if multiplier_column.shape[0] != words.shape[0]:
        multiplier_column = multiplier_column[: words.shape[0]]
    if _runs_on_cpu(words):
        # One pass over the words, no product tensor written: half the cost of the sum below.
        return tf.matmul(tf.reshape(words, constants((1, -1))), multiplier_column)
    products = words * tf.reshape(multiplier_column, constants((-1,)))
    return tf.reshape(tf.reduce_sum(products), constants((1, 1)))


def fingerprint_table(tensors):
    """The fingerprints of `tensors` as an int64 vector; one multiplier column serves all."""
    if not tensors:
        return tf.zeros([0], tf.int64)
    constants = _SharedConstants()
    word_vectors = [_words(tf.convert_to_tensor(tensor), constants) for tensor in tensors]
    column = _multiplier_column(max(words.shape[0] for words in word_vectors), constants)
    products = [_fingerprint(words, column, constants) for words in word_vectors]
    return tf.reshape(tf.concat(products, 0), constants((-1,)))
