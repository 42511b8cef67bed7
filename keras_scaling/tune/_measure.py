"""The TensorFlow side of `tune`: rounds of real `fit` calls of the model under each setting.

Each `(steps_per_execution, jit_compile, all-reduce options)` keeps its own train
function and each data setting its own pipeline, so switching settings costs no
retracing. Across workers every worker runs the same rounds, and each round's
figures and the clock are the chief's, sent to all: every worker takes the same
decisions, so their `fit` calls and all-reduces stay paired.
"""

import copy
import math
import time

from keras_scaling import _training_state, devices
from keras_scaling.tune._search import EPOCHS


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
        self._values = _training_state.saved(model)
        self._compiled = (model.steps_per_execution, model.jit_compile, model.train_function)
        compat.enable_for(strategy)
        # The all-reduce options across workers, when tune can set them.
        self._start_options = None
        if self.num_workers > 1:
            from keras_scaling.internals import _communication

            self._start_options = _communication.communication_options(strategy)
        self._broadcast = _chief_broadcast(strategy) if self.num_workers > 1 else None
        self._now_s = self.agree(time.perf_counter())

    @property
    def communication_settable(self):
        """Whether the all-reduce across workers (`communication`, `bytes_per_pack`) can be searched."""
        return self._start_options is not None

    def start_strategy_settings(self):
        """The start's all-reduce options across workers as `auto_strategy` keywords (empty: TensorFlow's)."""
        options = self._start_options
        if options is None:
            return {}
        settings = {}
        if options.implementation.name != "AUTO":
            settings["communication"] = options.implementation.name.lower()
        if options.bytes_per_pack:
            settings["bytes_per_pack"] = int(options.bytes_per_pack)
        return settings

    def apply_strategy_settings(self, strategy_settings):
        """Makes `communication` and `bytes_per_pack` of `strategy_settings` those of the train functions traced from now on."""
        if self.communication_settable:
            from keras_scaling.internals import _communication

            options = self._options_of(strategy_settings)
            _communication.set_communication_options(self.strategy, options)

    def gradient_sizes(self):
        """Bytes of each gradient a step all-reduces, in the order of the trainable variables."""
        import tensorflow as tf

        return tuple(
            math.prod(variable.shape) * tf.as_dtype(variable.dtype).size
            for variable in self.model.trainable_variables
        )

    def _options_of(self, strategy_settings):
        """The start's `CommunicationOptions` with `auto_strategy`'s `communication` and `bytes_per_pack` of `strategy_settings`."""
        import tensorflow as tf

        options = copy.deepcopy(self._start_options)
        assert options is not None  # called only when communication_settable
        name = strategy_settings.get("communication") or "auto"
        options.implementation = tf.distribute.experimental.CommunicationImplementation[
            name.upper()
        ]
        options.bytes_per_pack = int(strategy_settings.get("bytes_per_pack") or 0)
        return options

    def agree(self, *values):
        """`values` (floats) as the chief has them, on every worker; one value alone is returned alone."""
        if self._broadcast is not None:
            import tensorflow as tf

            values = tuple(float(v) for v in self._broadcast(tf.constant(values, tf.float64)))
        return values[0] if len(values) == 1 else values

    def clock_s(self):
        """Seconds of a clock every worker reads alike: across workers, the chief's at the last round."""
        return time.perf_counter() if self._broadcast is None else self._now_s

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

    def _use(self, compile_settings, strategy_settings):
        model = self.model
        steps_per_execution = int(compile_settings.get("steps_per_execution", 1))
        jit_compile = bool(compile_settings.get("jit_compile", False))
        key = (steps_per_execution, jit_compile, _frozen(strategy_settings))
        self.apply_strategy_settings(strategy_settings)
        model.steps_per_execution = steps_per_execution
        model.jit_compile = jit_compile
        if key not in self._functions:
            model.make_train_function(force=True)
            self._functions[key] = model.train_function
        model.train_function = self._functions[key]

    def round(self, settings, steps):
        """One round: `fit` of `EPOCHS` epochs of `steps` steps; returns (samples/sec after the first, wall seconds)."""
        dataset = self.dataset(settings["data"])
        self._use(settings["compile"], settings.get("strategy", {}))
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
        rate = (EPOCHS - 1) * samples / timer.timed_s
        if self._broadcast is None:
            return rate, wall_s
        rate, wall_s, self._now_s = self.agree(rate, wall_s, time.perf_counter())
        return rate, wall_s

    def restore(self):
        """Puts the model's variables, optimizer state and compile settings back as they were."""
        import keras
        import numpy as np

        if self.communication_settable:
            from keras_scaling.internals import _communication

            _communication.set_communication_options(self.strategy, self._start_options)
        # Slots the first step created start as they were made: zeros.
        _training_state.put_back(
            self.model,
            self._values,
            lambda variable: np.zeros(
                variable.shape, keras.backend.standardize_dtype(variable.dtype)
            ),
        )
        model = self.model
        model.steps_per_execution, model.jit_compile, model.train_function = self._compiled
        model.reset_metrics()


def _chief_broadcast(strategy):
    """A function of a float64 vector that returns, on every worker, the chief's."""
    import tensorflow as tf

    @tf.function
    def broadcast(values):
        def chiefs_only(values):
            context = tf.distribute.get_replica_context()
            first = tf.equal(context.replica_id_in_sync_group, 0)
            return context.all_reduce("SUM", tf.where(first, values, tf.zeros_like(values)))

        result = strategy.run(chiefs_only, args=(values,))
        return strategy.experimental_local_results(result)[0]

    return broadcast
