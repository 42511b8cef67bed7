"""Keras' epochs (its data adapter's `on_epoch_begin`) number the passes of `distribute`
datasets: an order counted by reads would shift on a worker that looked at a batch first."""

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
    for call in (
        "self.data_adapter = data_adapters.get_data_adapter(",
        "data_adapter.on_epoch_begin()",
    ):
        if call not in source:
            raise _probes.ReachError(f"EpochIterator no longer runs {call}...)")
    return epoch_iterator


def install() -> bool:
    """Makes Keras' epochs number `distribute`'s passes; False if the probe or the env refuses."""
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
