"""Keras' epochs number the passes of `distribute` datasets, not the reads.

Every worker must read epoch `e` of `fit` in the same order, and an order
counted by the passes a process read would shift on the worker that looked
at a batch before training. Keras makes a data adapter for the data of
every `fit`, `evaluate` and `predict` (`get_data_adapter`) and calls its
`on_epoch_begin` each time it starts going through the data, before the
first batch is read. For a dataset of `distribute` (or one made from it)
the replacement of `get_data_adapter` gives Keras' adapter an
`on_epoch_begin` that first numbers the pass (`PassCounter.begin_keras_epoch`),
and asks Keras for no shuffle of its own when the plan shuffles: Keras
cannot shuffle a dataset and would only warn that `fit(shuffle=True)` is
ignored. Other data goes to Keras untouched.

`get_data_adapter` is private to Keras; when it is not where this module
expects it (or `KERAS_SCALING_NO_COMPAT=1` keeps Keras untouched), passes
are numbered by the reads, and `distribute` says so with several workers.
"""

import functools
import importlib
import inspect
import threading

from keras_scaling.data import _iterator_plan, _passes
from keras_scaling.internals import _probes

_ADAPTERS_MODULE = "keras.src.trainers.data_adapters"
_EPOCH_ITERATOR_MODULE = "keras.src.trainers.epoch_iterator"
_ORIGINAL = "_keras_scaling_original"

_lock = threading.Lock()
_installed = False


@_probes.guarded(
    "keras.data_adapter_epochs",
    reaches=(
        f"{_ADAPTERS_MODULE}.get_data_adapter and EpochIterator's call of the "
        "adapter's on_epoch_begin"
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
def _adapters_module():
    """Keras' data adapters module, once its shape is checked, or None."""
    module = importlib.import_module(_ADAPTERS_MODULE)
    parameters = inspect.signature(module.get_data_adapter).parameters
    if "x" not in parameters or "shuffle" not in parameters:
        raise _probes.ReachError(
            f"get_data_adapter takes ({', '.join(parameters)}), not x and shuffle"
        )
    epoch_iterator = importlib.import_module(_EPOCH_ITERATOR_MODULE).EpochIterator
    try:
        source = inspect.getsource(epoch_iterator)
    except OSError as error:
        raise _probes.ReachError(f"EpochIterator's source is not readable: {error}") from error
    for call in ("data_adapters.get_data_adapter(", "data_adapter.on_epoch_begin()"):
        if call not in source:
            raise _probes.ReachError(f"EpochIterator no longer calls {call}...)")
    return module


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
        module = _adapters_module()
        if module is None:
            return False
        module.get_data_adapter = _numbering_passes(module.get_data_adapter)
        _installed = True
        return True


def _numbering_passes(original):
    """A `get_data_adapter` whose adapters of `distribute` datasets number their passes."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def get_data_adapter(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        dataset = _iterator_plan.distribute_dataset_behind(bound.arguments.get("x"))
        counter = None if dataset is None else _passes.counter_of(dataset)
        if counter is None:
            return original(*args, **kwargs)
        from keras_scaling import data

        plan = data.plan_of(dataset)
        if plan is not None and plan.shuffle:
            bound.arguments["shuffle"] = False
        adapter = original(*bound.args, **bound.kwargs)
        keras_on_epoch_begin = adapter.on_epoch_begin

        def on_epoch_begin():
            counter.begin_keras_epoch()
            return keras_on_epoch_begin()

        adapter.on_epoch_begin = on_epoch_begin
        return adapter

    setattr(get_data_adapter, _ORIGINAL, original)
    return get_data_adapter
