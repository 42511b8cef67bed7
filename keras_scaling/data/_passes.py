"""The pass index of a `distribute` pipeline: which order each pass reads.

Every pass over the pipeline (one per epoch in `fit`) takes the next index
from a counter when its first element is read, and its shuffle order is a
function of the seed and that index alone. An iterator that is created and
dropped unread (Keras makes one at each epoch's end) takes no index, and a
resume sets the index the next pass reads (`set_next_pass`), so the saved
epoch gets its order again.
"""

import threading

import tensorflow as tf

_COUNTER_ATTRIBUTE = "_keras_scaling_pass_counter"


class PassCounter:
    """Counts the passes read over one pipeline; its `next_pass` can be set.

    The counter is a variable on this host's CPU, created on a thread of its
    own: a strategy's scope (which would mirror it over the replicas) and a
    device scope are per thread.
    """

    def __init__(self) -> None:
        created: list[tf.Variable] = []

        def create() -> None:
            with tf.device("/cpu:0"):
                created.append(tf.Variable(0, dtype=tf.int64, trainable=False))

        thread = threading.Thread(target=create, name="keras_scaling-pass-counter")
        thread.start()
        thread.join()
        self._next_pass = created[0]

    def take(self) -> tf.Tensor:
        """The index of the pass starting now; the counter moves on (in the pipeline's graph)."""
        return self._next_pass.assign_add(1) - 1

    @property
    def next_pass(self) -> int:
        """The index the next pass to be read takes."""
        return int(self._next_pass.numpy())

    def set_next_pass(self, index: int) -> None:
        """Makes the next pass read the order of pass `index`."""
        self._next_pass.assign(int(index))


def each_pass(counter: PassCounter, build_pass) -> tf.data.Dataset:
    """A dataset whose every pass is `build_pass(index)`, `index` from `counter`."""

    # Plain TensorFlow calls: AutoGraph's conversion would only slow the tracing.
    @tf.autograph.experimental.do_not_convert
    def one_pass(_):
        return build_pass(counter.take())

    return tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).flat_map(one_pass)


def attach(dataset: tf.data.Dataset, counter: PassCounter) -> None:
    """Records `counter` as the pass counter of `dataset`."""
    setattr(dataset, _COUNTER_ATTRIBUTE, counter)


def counter_of(dataset) -> PassCounter | None:
    """The pass counter of a dataset `distribute` returned, else None."""
    return getattr(dataset, _COUNTER_ATTRIBUTE, None)


def pass_seed(seed: int, index: tf.Tensor) -> tf.Tensor:
    """The shuffle seed of pass `index`: a function of `seed` and `index` only."""
    return tf.random.stateless_uniform(
        [],
        seed=tf.stack([tf.constant(seed, tf.int64), tf.cast(index, tf.int64)]),
        minval=0,
        maxval=2**31 - 1,
        dtype=tf.int64,
    )
