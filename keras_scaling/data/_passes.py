"""The pass index of a `distribute` pipeline, of which each pass's shuffle order is a function:
Keras' epochs number the passes (reads would shift on a worker that looked at a batch first)."""

import functools
import importlib
import inspect
import threading

import tensorflow as tf

from keras_scaling import _threads
from keras_scaling.data import _iterator_plan
from keras_scaling.internals import _probes

COUNTER_ATTRIBUTE = "_keras_scaling_pass_counter"
_EPOCH_ITERATOR_MODULE = "keras.src.trainers.epoch_iterator"
_install_lock = threading.Lock()
_installed = False


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

    def _last_taken(self) -> int:
        return int(self._next_pass.numpy()) - 1

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
            return self._keras_next_pass if self._keras_pass is not None else self._last_taken() + 1

    @property
    def pass_in_progress(self) -> int:
        """The index of the pass being read (once its first element is read)."""
        with self._lock:
            return self._keras_pass if self._keras_pass is not None else self._last_taken()

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
    pair = tf.stack([tf.constant(seed, tf.int64), tf.cast(index, tf.int64)])
    return tf.random.stateless_uniform([], pair, minval=0, maxval=2**31 - 1, dtype=tf.int64)


@_probes.guarded(
    "keras.epoch_iterator_passes",
    reaches=f"{_EPOCH_ITERATOR_MODULE}.EpochIterator (its data adapter's on_epoch_begin)",
    lost="the passes of keras_scaling.data.distribute datasets are numbered by each process's reads, not by Keras' epochs: a batch read outside fit on one worker shifts its order against the others', and fit(shuffle=True) warns that it is ignored",
    workaround="Read the dataset only through fit, evaluate and predict, the same on every worker (look at batches of a second distribute() call).",
)
def _epoch_iterator_class():
    epoch_iterator = importlib.import_module(_EPOCH_ITERATOR_MODULE).EpochIterator
    parameters = inspect.signature(epoch_iterator.__dict__["__init__"]).parameters
    if "x" not in parameters or "shuffle" not in parameters:
        raise _probes.ReachError(
            f"EpochIterator.__init__ takes ({', '.join(parameters)}), not x and shuffle"
        )
    try:
        source = inspect.getsource(epoch_iterator)
    except OSError as error:
        raise _probes.ReachError(f"EpochIterator's source is not readable: {error}") from error
    for call in ("self.data_adapter = data_adapters.", "data_adapter.on_epoch_begin()"):
        if call not in source:
            raise _probes.ReachError(f"EpochIterator no longer runs {call}...)")
    return epoch_iterator


def install() -> bool:
    """Makes Keras' epochs number `distribute`'s passes; False if the probe or the env refuses."""
    global _installed
    from keras_scaling import compat

    with _install_lock:
        if _installed or compat._env_disables():
            return _installed
        epoch_iterator = _epoch_iterator_class()
        if epoch_iterator is None:
            return False
        epoch_iterator.__init__ = _numbering_passes(epoch_iterator.__dict__["__init__"])
        _installed = True
        return True


def _numbering_passes(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        dataset = _iterator_plan.distribute_dataset_behind(bound.arguments.get("x"))
        counter = counter_of(dataset)
        if counter is None:
            return original(*args, **kwargs)
        from keras_scaling import data

        plan = data.plan_of(dataset)
        # Keras cannot shuffle a dataset; it would only warn that shuffle=True is ignored.
        if plan is not None and plan.shuffle:
            bound.arguments["shuffle"] = False
        original(*bound.args, **bound.kwargs)
        adapter = bound.arguments["self"].data_adapter
        keras_on_epoch_begin = adapter.on_epoch_begin

        def on_epoch_begin():
            counter.begin_keras_epoch()
            return keras_on_epoch_begin()

        adapter.on_epoch_begin = on_epoch_begin

    return __init__
