"""Keras' epochs number the passes of `distribute` datasets, not the reads.

Every worker must read epoch `e` of `fit` in the same order, and an order
counted by the passes a process read would shift on the worker that looked
at a batch before training. Every `fit`, `evaluate` and `predict` makes an
`EpochIterator`, which makes a data adapter for the data and calls its
`on_epoch_begin` each time it starts going through the data, before the
first batch is read. For a dataset of `distribute` (or one made from it)
the replacement of `EpochIterator.__init__` gives Keras' adapter an
`on_epoch_begin` that first numbers the pass (`PassCounter.begin_keras_epoch`),
and asks Keras for no shuffle of its own when the plan shuffles: Keras
cannot shuffle a dataset and would only warn that `fit(shuffle=True)` is
ignored. Other data goes to Keras untouched, and Keras' warnings keep their
place (the `__init__` that calls `get_data_adapter` is still Keras' own).

`EpochIterator` is private to Keras; when it is not of the shape this module
knows (or `KERAS_SCALING_NO_COMPAT=1` keeps Keras untouched), passes are
numbered by the reads, and `distribute` says so with several workers.
"""

import functools
import importlib
import inspect
import threading

from keras_scaling.data import _iterator_plan, _passes
from keras_scaling.internals import _probes

_EPOCH_ITERATOR_MODULE = "keras.src.trainers.epoch_iterator"

_lock = threading.Lock()
_installed = False


@_probes.guarded(
    "keras.epoch_iterator_passes",
    reaches=(
        f"{_EPOCH_ITERATOR_MODULE}.EpochIterator (its data adapter and the "
        "adapter's on_epoch_begin)"
    ),
    lost=(
        "the passes of keras_scaling.data.distribute datasets are numbered by "
        "the reads of each process, not by Keras' epochs: a batch read outside "
        "fit on one worker shifts that worker's order against the others', and "
        "fit(shuffle=True) warns that it is ignored"
    ),
    workaround=(
        "Read the dataset only through fit, evaluate and predict, the same on "
        "every worker (look at batches of a second distribute() call)."
    ),
)
def _epoch_iterator_class():
    """Keras' `EpochIterator`, once its shape is checked, or None."""
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
    for call in (
        "self.data_adapter = data_adapters.get_data_adapter(",
        "data_adapter.on_epoch_begin()",
    ):
        if call not in source:
            raise _probes.ReachError(f"EpochIterator no longer runs {call}...)")
    return epoch_iterator


def install() -> bool:
    """Makes Keras' epochs number the passes of `distribute` datasets (once per process).

    Returns:
        bool, whether they do: False when Keras' adapter cannot be reached
        (its probe warned) or `KERAS_SCALING_NO_COMPAT=1` keeps Keras untouched.
    """
    global _installed
    from keras_scaling import compat

    with _lock:
        if _installed:
            return True
        if compat._env_disables():
            return False
        epoch_iterator = _epoch_iterator_class()
        if epoch_iterator is None:
            return False
        epoch_iterator.__init__ = _numbering_passes(epoch_iterator.__dict__["__init__"])
        _installed = True
        return True


def _numbering_passes(original):
    """An `EpochIterator.__init__` whose adapters of `distribute` datasets number their passes."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        dataset = _iterator_plan.distribute_dataset_behind(bound.arguments.get("x"))
        counter = None if dataset is None else _passes.counter_of(dataset)
        if counter is None:
            return original(*args, **kwargs)
        from keras_scaling import data

        plan = data.plan_of(dataset)
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
