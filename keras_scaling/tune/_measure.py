"""The TensorFlow side of `tune`: rounds of real `fit` calls of the model under each setting.

Each `(steps_per_execution, jit_compile)` keeps its own train function and each
data setting its own pipeline, so switching settings costs no retracing.
"""

import time

from keras_scaling import devices

# Epochs of one round's `fit`: the first is not timed.
EPOCHS = 3


def _timer_callback():
    import keras

    class EpochTimer(keras.callbacks.Callback):
        """Seconds from the first epoch's end to the last's (the logs wait for the steps)."""

        def on_train_begin(self, logs=None):
            self.ends_s = []

        def on_epoch_end(self, epoch, logs=None):
            self.ends_s.append(time.perf_counter())

        @property
        def timed_s(self):
            return self.ends_s[-1] - self.ends_s[0]

    return EpochTimer()


def _frozen(mapping):
    return tuple(sorted((key, repr(value)) for key, value in mapping.items()))


class Runner:
    """Rounds of `fit` under given settings; with `settings["data"]` empty, `data` is a dataset of global batches."""

    def __init__(self, model, strategy, data):
        from keras_scaling import compat

        self.model = model
        self.strategy = strategy
        self.data = data
        info = devices.describe_strategy(strategy)
        self.num_replicas = info.num_replicas
        self.num_workers = info.num_workers
        self.local_replicas = info.replicas_per_worker
        self.device_kind = info.device_kind
        self._functions = {}
        self._datasets = {}
        self._global_batch_sizes = {}
        self._plans = {}
        # What `restore` puts back.
        self._values = [(variable, variable.numpy()) for variable in model.variables]
        optimizer = getattr(model, "optimizer", None)
        self._optimizer_values = (
            {} if optimizer is None else {id(v): v.numpy() for v in optimizer.variables}
        )
        self._compiled = (model.steps_per_execution, model.jit_compile, model.train_function)
        compat.enable_for(strategy)

    def dataset(self, data_settings):
        """The repeated pipeline of `data_settings` (built once per setting)."""
        key = _frozen(data_settings)
        if key not in self._datasets:
            import tensorflow as tf

            from keras_scaling import data as data_module

            if data_settings:
                dataset = data_module.distribute(self.data, strategy=self.strategy, **data_settings)
            else:
                dataset = self.data
            # From distribute's plan: a batch read here would leave its cache partly filled.
            plan = self._plans[key] = data_module.plan_of(dataset)
            if plan is not None:
                self._global_batch_sizes[key] = plan.global_batch_size
            else:
                batch = next(iter(dataset))
                worker_batch = int(tf.nest.flatten(batch)[0].shape[0])
                self._global_batch_sizes[key] = worker_batch * self.num_workers
            self._datasets[key] = dataset.repeat()
        return self._datasets[key]

    def plan(self, data_settings):
        """The `InputPlan` of the pipeline `distribute` builds for `data_settings`, or None without one."""
        self.dataset(data_settings)
        return self._plans[_frozen(data_settings)]

    def global_batch_size(self, data_settings):
        self.dataset(data_settings)
        return self._global_batch_sizes[_frozen(data_settings)]

    def _use(self, compile_settings):
        model = self.model
        steps_per_execution = int(compile_settings.get("steps_per_execution", 1))
        jit_compile = bool(compile_settings.get("jit_compile", False))
        key = (steps_per_execution, jit_compile)
        model.steps_per_execution = steps_per_execution
        model.jit_compile = jit_compile
        if key not in self._functions:
            model.make_train_function(force=True)
            self._functions[key] = model.train_function
        model.train_function = self._functions[key]

    def round(self, settings, steps):
        """One round: `fit` of `EPOCHS` epochs of `steps` steps; returns (samples/sec after the first, wall seconds)."""
        dataset = self.dataset(settings["data"])
        self._use(settings["compile"])
        timer = _timer_callback()
        started_s = time.perf_counter()
        self.model.fit(
            dataset,
            steps_per_epoch=steps,
            epochs=EPOCHS,
            verbose=0,
            shuffle=False,
            callbacks=[timer],
        )
        wall_s = time.perf_counter() - started_s
        samples = steps * self.global_batch_size(settings["data"])
        return (EPOCHS - 1) * samples / timer.timed_s, wall_s

    def restore(self):
        """Puts the model's variables, optimizer state and compile settings back as they were."""
        import keras
        import numpy as np

        for variable, value in self._values:
            variable.assign(value)
        optimizer = getattr(self.model, "optimizer", None)
        for variable in optimizer.variables if optimizer is not None else ():
            saved = self._optimizer_values.get(id(variable))
            # Slots the first step created start as they were made: zeros.
            if saved is None:
                saved = np.zeros(variable.shape, keras.backend.standardize_dtype(variable.dtype))
            variable.assign(saved)
        model = self.model
        model.steps_per_execution, model.jit_compile, model.train_function = self._compiled
        model.reset_metrics()
