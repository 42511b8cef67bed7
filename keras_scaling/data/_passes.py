"""The pass index of a `distribute` pipeline, which each pass's shuffle order is a function of:
Keras' epochs number the passes once they start, until then a pass's first read does."""

import threading

import tensorflow as tf

from keras_scaling import _threads

COUNTER_ATTRIBUTE = "_keras_scaling_pass_counter"


def _new_counter_variable() -> tf.Variable:
    with tf.device("/cpu:0"):
        return tf.Variable(0, dtype=tf.int64, trainable=False)


class PassCounter:
    """Numbers the passes read over one pipeline; the next number can be set."""

    def __init__(self) -> None:
        # A strategy's scope (which would mirror the variable) is per thread.
        self._next_pass = _threads.run_outside_strategy(_new_counter_variable, "pass-counter")
        self._lock = threading.Lock()
        # None until Keras starts its first epoch over the pipeline.
        self._keras_pass: int | None = None
        self._keras_next_pass = 0

    def take(self) -> tf.Tensor:
        """The index of the pass starting now (in the pipeline's graph)."""
        return self._next_pass.assign_add(1) - 1

    def begin_keras_epoch(self) -> None:
        """Keras starts an epoch over the pipeline: its pass takes Keras' next number."""
        with self._lock:
            index = self._keras_next_pass
            self._keras_pass, self._keras_next_pass = index, index + 1
            self._next_pass.assign(index)

    @property
    def next_pass(self) -> int:
        """The index the next pass takes: Keras' next epoch's, once Keras numbers them."""
        with self._lock:
            if self._keras_pass is not None:
                return self._keras_next_pass
            return int(self._next_pass.numpy())

    @property
    def pass_in_progress(self) -> int:
        """The index of the pass being read (once its first element is read)."""
        with self._lock:
            if self._keras_pass is not None:
                return self._keras_pass
            return int(self._next_pass.numpy()) - 1

    def set_next_pass(self, index: int) -> None:
        """Makes the next pass read pass `index`'s order; later ones follow `index + 1`, ..."""
        index = int(index)
        with self._lock:
            if self._keras_pass is not None:
                self._keras_pass, self._keras_next_pass = index, index + 1
            self._next_pass.assign(index)


def each_pass(counter: PassCounter, build_pass) -> tf.data.Dataset:
    """A dataset whose every pass is `build_pass(index)`, `index` from `counter`."""

    # Plain TensorFlow calls: AutoGraph's conversion would only slow the tracing.
    @tf.autograph.experimental.do_not_convert
    def one_pass(_):
        return build_pass(counter.take())

    return tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).flat_map(one_pass)


def counter_of(dataset) -> PassCounter | None:
    return getattr(dataset, COUNTER_ATTRIBUTE, None)


def pass_seed(seed: int, index: tf.Tensor) -> tf.Tensor:
    """The shuffle seed of pass `index`: a function of `seed` and `index` only."""
    return tf.random.stateless_uniform(
        [],
        seed=tf.stack([tf.constant(seed, tf.int64), tf.cast(index, tf.int64)]),
        minval=0,
        maxval=2**31 - 1,
        dtype=tf.int64,
    )
