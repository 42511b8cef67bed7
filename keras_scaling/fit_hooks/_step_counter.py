"""The one reader of a model's step counter: the batches its optimizer has applied.

`optimizer.iterations` counts weight updates with `gradient_accumulation_steps`
in recent Keras: the batches are then read through a probe. One replica's copy
is read: all are equal, and reading a mirrored variable whole costs several times more.
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


class BatchCounter:
    """Reads how many batches a compiled `model`'s optimizer applied: one `ReadVariableOp` a read."""

    def __init__(self, model):
        self._model = model
        self._optimizer = None
        self._counter = None

    def read(self):
        """The batches applied so far, an int; None when the probe cannot reach the counter."""
        optimizer = self._model.optimizer
        if optimizer is not self._optimizer:
            counting = inner_optimizers(optimizer)[-1]
            accumulates = accumulation_steps(counting) > 1
            variable = (
                _keras.accumulating_batch_counter(counting) if accumulates else counting.iterations
            )
            self._optimizer = optimizer
            strategy = self._model.distribute_strategy
            self._counter = None if variable is None else _topology.local_copy(variable, strategy)
        return None if self._counter is None else _topology.read_int(self._counter)
