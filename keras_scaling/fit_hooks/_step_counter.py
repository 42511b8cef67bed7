"""The one reader of a model's step counter: the batches its optimizer has applied.

Every figure of keras_scaling that counts steps counts batches, as `fit`
does: samples trained (batches times the global batch), steps per second,
a resume's position in the epoch. Keras' optimizer counts the batches it
applied in one variable, which its public `iterations` is, except with
`gradient_accumulation_steps=N`: there recent Keras releases make
`iterations` the number of weight updates (the batches divided by N, a new
tensor at each read), and the batches are read through a probe
(`keras_scaling.internals._keras.accumulating_batch_counter`).
`weight_updates` turns batches into weight updates, for `ReplicaSyncCheck`,
whose `every_n_steps` counts updates.

Read from one replica's copy: all copies are equal, and reading a mirrored
variable as a whole costs several times more.
"""

from keras_scaling.devices import _topology
from keras_scaling.internals import _keras
from keras_scaling.replica_sync._tracked_variables import inner_optimizers


def _counting_optimizer(optimizer):
    # A LossScaleOptimizer wraps the optimizer that counts the batches.
    return inner_optimizers(optimizer)[-1]


def accumulation_steps(optimizer):
    """The batches per weight update of `optimizer`: its `gradient_accumulation_steps`, or 1."""
    return int(getattr(_counting_optimizer(optimizer), "gradient_accumulation_steps", None) or 1)


def weight_updates(batches, steps_per_update):
    """The weight updates that `batches` batches made, `steps_per_update` batches each.

    With gradient accumulation, Keras updates the weights at every
    `steps_per_update`-th batch: 7 batches at 2 per update made 3 updates.

    Args:
        batches: int, batches applied, as `BatchCounter.read` returns.
        steps_per_update: int, `accumulation_steps(optimizer)`.

    Returns:
        int.
    """
    return batches // steps_per_update


class BatchCounter:
    """Reads how many batches a model's optimizer has applied (its step counter).

    The variable is found at the first read and kept, so that a read costs
    one `ReadVariableOp` (`_topology.read_int`); a new optimizer is found
    anew. `read` returns None when the counter cannot be reached (an
    optimizer that accumulates gradients, on a Keras whose private counter
    moved: the probe has warned once).

    Args:
        model: a compiled `keras.Model`.
    """

    def __init__(self, model):
        self._model = model
        self._optimizer = None
        self._counter = None

    def _find(self):
        optimizer = self._model.optimizer
        if optimizer is self._optimizer:
            return self._counter
        counting = _counting_optimizer(optimizer)
        if accumulation_steps(counting) > 1:
            variable = _keras.accumulating_batch_counter(counting)
        else:
            variable = counting.iterations
        self._optimizer = optimizer
        self._counter = (
            None
            if variable is None
            else _topology.local_copy(variable, self._model.distribute_strategy)
        )
        return self._counter

    def read(self):
        """The batches applied so far, an int; reading waits for the devices. None when unknown."""
        counter = self._find()
        return None if counter is None else _topology.read_int(counter)
