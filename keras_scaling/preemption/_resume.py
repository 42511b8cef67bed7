"""An exact resume inside an epoch: the `distribute` data behind `fit`'s iterator, its next pass
set to the saved one, and the trained steps' batches read, not trained."""

from keras_scaling.data import _iterator_plan, _passes


class TrainingData:
    """The `distribute` dataset `fit` trains on: its `InputPlan` and its pass numbers, which are
    None for data not shuffled (their order has no pass)."""

    def __init__(self, plan, counter):
        self.plan = plan
        self._counter = counter

    @classmethod
    def behind(cls, iterator):
        """The `TrainingData` behind the train function's iterator, or None for other data."""
        from keras_scaling import data

        dataset = _iterator_plan.distributed_dataset(iterator)
        plan, counter = data.plan_of(dataset), _passes.counter_of(dataset)
        return None if plan is None or counter is None else cls(plan, counter)

    @property
    def pass_in_progress(self):
        return self._counter.pass_in_progress if self.plan.shuffle else None

    @property
    def next_pass(self):
        return self._counter.next_pass if self.plan.shuffle else None

    def read_pass_next(self, pass_number):
        if self.plan.shuffle:
            self._counter.set_next_pass(pass_number)


def why_not_exact(training_data, steps_per_epoch):
    """Why steps inside an epoch cannot be skipped exactly, or "" when they can."""
    if training_data is None:
        return "the data does not come from keras_scaling.data.distribute"
    if not steps_per_epoch:
        return "the number of steps per epoch is unknown"
    if steps_per_epoch != training_data.plan.steps_per_epoch:
        return (
            f"fit's epochs of {steps_per_epoch} steps are not whole passes over the data "
            f"({training_data.plan.steps_per_epoch} steps): steps_per_epoch was given"
        )
    return ""


class BatchSkipper:
    """In place of the train function (`TrainFunctionHook.skip`): reads one execution's
    batches and returns the metrics as they stand, until `steps` are read; then None."""

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
