"""Keras' epoch iterator, positioned for an exact resume inside an epoch.

Keras hands callbacks no handle on the data: the epoch iterator of a running
`fit` is a local of `fit` (`epoch_iterator`), found on the call stack. Every
epoch, Keras calls its `_get_iterator()` and iterates the result; each
iterator created on a dataset of `keras_scaling.data.distribute` draws the
next seeded shuffle order. `EpochIteratorHook` replaces that method on this
one iterator object (nothing is patched globally) to count the iterators
created, and, on resume, to create the ones a stopped run had created (so the
saved epoch gets its own order) and to consume the steps it had trained.

Keras gives a callback no public handle on that iterator (it is created
before the callbacks are), so these private Keras names are reached through
one probe of `keras_scaling.internals._probes`: when they are not there or not of the
shape this module knows, exact resume is off with one warning naming the
Keras version (the run resumes at the start of the saved epoch, as Keras'
own `BackupAndRestore` does).
"""

import sys
import types

from keras_scaling import data
from keras_scaling.internals import _probes

_REQUIRED_ATTRIBUTES = ("_get_iterator", "_num_batches", "data_adapter", "steps_per_epoch")


@_probes.guarded(
    "keras.fit.resume_epoch_iterator",
    reaches=(
        "the `epoch_iterator` local of keras.Model.fit (read from the call stack) "
        "and its _get_iterator, _num_batches and data_adapter"
    ),
    lost=(
        "exact resume inside an epoch: a resume starts at the beginning of the "
        "saved epoch, as keras.callbacks.BackupAndRestore does"
    ),
    workaround="Save at epoch ends only (save_every_n_steps=None) or use shorter epochs.",
)
def running_epoch_iterator():
    """The epoch iterator of the `fit` on the call stack, of the known shape.

    Raises when it is not found or not of the shape this module knows; the
    guard then warns once and returns None.
    """
    frame: types.FrameType | None = sys._getframe(1)
    try:
        while frame is not None:
            if frame.f_code.co_name == "fit" and "epoch_iterator" in frame.f_locals:
                epoch_iterator = frame.f_locals["epoch_iterator"]
                break
            frame = frame.f_back
        else:
            raise LookupError("the epoch iterator of fit was not found on the call stack")
    finally:
        del frame
    missing = [name for name in _REQUIRED_ATTRIBUTES if not hasattr(epoch_iterator, name)]
    if missing:
        raise AttributeError(f"Keras' epoch iterator has no {', '.join(missing)}")
    if not callable(getattr(epoch_iterator.data_adapter, "get_tf_dataset", None)):
        raise AttributeError("Keras' data adapter has no get_tf_dataset()")
    return epoch_iterator


class _Started:
    """An iterable whose `iter()` is an iterator already advanced."""

    def __init__(self, iterator):
        self._iterator = iterator

    def __iter__(self):
        return self._iterator


class EpochIteratorHook:
    """Counts, and on resume positions, the iterators of one `fit`'s training data.

    Args:
        epoch_iterator: the `TFEpochIterator` of the running `fit`.

    Attributes:
        plan: the `InputPlan` of the training dataset, or None when it does
            not come from `keras_scaling.data.distribute`.
        iterators_created: iterators Keras created on the data since the
            hook was attached.
        steps_skipped: steps of the current epoch consumed without training
            (a resume), 0 otherwise.
    """

    def __init__(self, epoch_iterator):
        self._epoch_iterator = epoch_iterator
        self._original = epoch_iterator._get_iterator
        try:
            dataset = epoch_iterator.data_adapter.get_tf_dataset()
        except Exception:  # an adapter of a data type without a tf.data form
            dataset = None
        self.plan = data.plan_of(dataset)
        self.iterators_created = 0
        self.steps_skipped = 0
        self._pending = None
        self._shortened = False
        epoch_iterator._get_iterator = self._get_iterator

    @property
    def steps_per_epoch(self):
        """Keras' steps per epoch for this data, or None when unknown."""
        return self._epoch_iterator.num_batches

    def can_skip(self):
        """Whether steps inside an epoch can be skipped exactly: `(ok, why)`."""
        if self.plan is None:
            return False, "the data does not come from keras_scaling.data.distribute"
        if self._epoch_iterator.steps_per_epoch:
            return False, "fit was given steps_per_epoch"
        if not self._epoch_iterator._num_batches:
            return False, "the number of steps per epoch is unknown"
        return True, ""

    def resume_at(self, dataset_iterations, steps_to_skip):
        """Positions the next epoch's iterator: its order, then the steps to skip.

        Args:
            dataset_iterations: int, iterators the stopped run had created
                before the one of the resumed epoch.
            steps_to_skip: int, steps of that epoch already trained.
        """
        self._pending = (dataset_iterations, steps_to_skip)

    def detach(self):
        """Gives the epoch iterator its own `_get_iterator` back."""
        self._epoch_iterator.__dict__.pop("_get_iterator", None)

    def _get_iterator(self):
        iterable = self._original()
        epoch_iterator = self._epoch_iterator
        if self._shortened:
            epoch_iterator._num_batches = epoch_iterator.data_adapter.num_batches
            self._shortened = False
        self.steps_skipped = 0
        pending, self._pending = self._pending, None
        if pending is None:
            self.iterators_created += 1
            return iterable
        target, steps_to_skip = pending
        while self.iterators_created < target:
            # Each iterator draws the next shuffle order of the data.
            iter(iterable)
            self.iterators_created += 1
        self.iterators_created += 1
        if not steps_to_skip:
            return iterable
        iterator = iter(iterable)
        for _ in range(steps_to_skip):
            next(iterator)
        # Keras then runs the rest of the epoch and ends it where the data ends.
        epoch_iterator._num_batches -= steps_to_skip
        self._shortened = True
        self.steps_skipped = steps_to_skip
        return _Started(iterator)


def attach():
    """An `EpochIteratorHook` on the running `fit`'s data, or None.

    None when the epoch iterator is not found or not of the known shape: the
    probe has then said, once, what is lost.
    """
    epoch_iterator = running_epoch_iterator()
    return None if epoch_iterator is None else EpochIteratorHook(epoch_iterator)
