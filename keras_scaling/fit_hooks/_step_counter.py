"""The one reader of a model's step counter: the batches its optimizer has applied.

`optimizer.iterations` counts weight updates with `gradient_accumulation_steps`
in recent Keras: the batches are then read through a probe. One replica's copy
is read: all are equal, and reading a mirrored variable whole costs several times more.

A model whose own `train_step` steps optimizers it holds (a GAN's `d_optimizer`
and `g_optimizer`) leaves `model.optimizer` still. Its batches are counted by the
held optimizer that advanced least (a WGAN's critic steps several times a batch).
"""

from keras_scaling.devices import _topology
from keras_scaling.internals import _keras
from keras_scaling.replica_sync._tracked_variables import inner_optimizers


def accumulation_steps(optimizer):
    """The batches per weight update of `optimizer`: its `gradient_accumulation_steps`, or 1."""
    counting = inner_optimizers(optimizer)[-1]  # a LossScaleOptimizer wraps the counting one
    return int(getattr(counting, "gradient_accumulation_steps", None) or 1)


def weight_updates(batches, steps_per_update):
    """The weight updates that `batches` batches made: 7 batches at 2 per update made 3."""
    return batches // steps_per_update


def held_optimizers(model):
    """`{name: optimizer}`: `model.optimizer` as "optimizer", then the Keras optimizers held in `model`'s attributes, by name."""
    import keras

    held = {"optimizer": getattr(model, "optimizer", None)}
    for name, value in sorted(vars(model).items()):
        if isinstance(value, keras.optimizers.Optimizer) and all(
            value is not known for known in held.values()
        ):
            held[name] = value
    return held


def unbuilt_held_optimizers(model):
    """The names of the optimizers `model` holds besides `model.optimizer` that are not built."""
    held = list(held_optimizers(model).items())[1:]
    return [name for name, optimizer in held if not optimizer.built]


def _batch_counter(optimizer, strategy):
    """The local variable counting the batches `optimizer` applied; None when the probe cannot reach it."""
    counting = inner_optimizers(optimizer)[-1]
    accumulates = accumulation_steps(counting) > 1
    variable = _keras.accumulating_batch_counter(counting) if accumulates else counting.iterations
    return None if variable is None else _topology.local_copy(variable, strategy)


class BatchCounter:
    """Reads how many batches a compiled `model` has trained: one `ReadVariableOp` a read.

    `model.optimizer` counts. When the model holds other optimizers, each read reads them
    all until one advances: if `model.optimizer` did not, the held one that advanced least
    counts from then on, added to where `model.optimizer` stood.
    """

    def __init__(self, model):
        self._model = model
        self._optimizer = None

    def read(self):
        """The batches applied so far, an int; None when the probe cannot reach the counter."""
        optimizer = self._model.optimizer
        if optimizer is not self._optimizer:
            self._optimizer = optimizer
            strategy = self._model.distribute_strategy
            held = [_batch_counter(o, strategy) for o in held_optimizers(self._model).values()]
            self._counters = held[:1] if held[0] is None else [c for c in held if c is not None]
            self._counting = 0 if len(self._counters) == 1 else None
            self._base = self._start = 0
            self._values = None
        if self._counters[0] is None:
            return None
        counting = self._counting
        if counting is None:
            values = [_topology.read_int(counter) for counter in self._counters]
            counting = self._choose_counting(values)
            if counting is None:
                return values[0]
        return self._base + _topology.read_int(self._counters[counting]) - self._start

    def _choose_counting(self, values):
        """The index of the counter that counts, once one advanced since the last read; else None."""
        before, self._values = self._values or values, values
        advanced = [(now - then, index) for index, (now, then) in enumerate(zip(values, before))]
        if advanced[0][0] > 0:
            self._counting = 0
        elif any(advance > 0 for advance, _ in advanced):
            self._counting = min(pair for pair in advanced if pair[0] > 0)[1]
            self._base, self._start = before[0], before[self._counting]
        return self._counting
