"""An exact resume inside an epoch, from the data `fit` reads and nothing else.

A dataset of `keras_scaling.data.distribute` numbers its passes (one per
epoch, by Keras' epochs) and shuffles each by the seed and its number alone. A backup records
the number of the pass its epoch read and the steps already trained in it.
On resume, before the first step, the dataset is found behind the iterator
Keras' train function is called with (`TrainingData.behind`), its next pass
is set to the saved one, and the first calls of the train function read the
batches of the trained steps without training them (`BatchSkipper`): the
epoch keeps its length, and every later step trains the batch the stopped
run would have trained.
"""

from keras_scaling.data import _iterator_plan, _passes


class TrainingData:
    """The `distribute` dataset `fit` trains on: its plan and its pass counter.

    Args:
        plan: its `InputPlan`.
        counter: its `PassCounter`.
    """

    def __init__(self, plan, counter):
        self.plan = plan
        self._counter = counter

    @classmethod
    def behind(cls, iterator):
        """The `TrainingData` behind the iterator of Keras' train function, or None.

        None when the data does not come from `keras_scaling.data.distribute`
        (or TensorFlow's iterator cannot be traced back to it: its probe then
        says so, once).
        """
        dataset = _iterator_plan.distributed_dataset(iterator)
        if dataset is None:
            return None
        from keras_scaling import data

        plan = data.plan_of(dataset)
        counter = _passes.counter_of(dataset)
        return None if plan is None or counter is None else cls(plan, counter)

    @property
    def pass_in_progress(self):
        """The number of the pass being read (once a step of the epoch ran), or
        None for data read in one order in every pass (not shuffled)."""
        return self._counter.pass_in_progress if self.plan.shuffle else None

    @property
    def next_pass(self):
        """The number the next pass takes (at an epoch's end: the next epoch's),
        or None for data read in one order in every pass."""
        return self._counter.next_pass if self.plan.shuffle else None

    def read_pass_next(self, pass_number):
        """Makes the next pass (the next epoch) read in the order of `pass_number`.

        Data read in one order in every pass has no pass number (None) to set.
        """
        if self.plan.shuffle:
            self._counter.set_next_pass(pass_number)


def why_not_exact(training_data, steps_per_epoch):
    """Why steps inside an epoch cannot be skipped exactly, or "" when they can.

    Args:
        training_data: a `TrainingData`, or None.
        steps_per_epoch: int or None, the steps of one of `fit`'s epochs.
    """
    if training_data is None:
        return "the data does not come from keras_scaling.data.distribute"
    if not steps_per_epoch:
        return "the number of steps per epoch is unknown"
    if steps_per_epoch != training_data.plan.steps_per_epoch:
        return (
            f"fit's epochs of {steps_per_epoch} steps are not whole passes over "
            f"the data ({training_data.plan.steps_per_epoch} steps): "
            "steps_per_epoch was given"
        )
    return ""


class BatchSkipper:
    """Reads the batches of steps already trained, without training them.

    Called in place of the train function (`TrainFunctionHook.skip`): each
    call reads one execution's batches (`steps_per_execution`) and returns
    the model's metrics as they stand, until `steps` batches are read; then
    it returns None and the train function runs.

    Args:
        model: the Keras model.
        steps: int, the steps to skip.
    """

    def __init__(self, model, steps):
        self._model = model
        self.remaining = int(steps)

    def __call__(self, iterator):
        if self.remaining <= 0:
            return None
        count = min(self._model.steps_per_execution, self.remaining)
        for _ in range(count):
            next(iterator)
        self.remaining -= count
        return self._model.get_metrics_result()
