"""Fix for keras-team/keras#19246: the per-step `tf.function` that Keras calls inside `tf.cond`
loses its captured inputs under a mirrored strategy; the step is inlined in the loop instead."""

import tensorflow as tf

from keras_scaling.compat import _keras_source, _keras_trainer
from keras_scaling.devices import _topology

NAME = "steps_per_execution"
ISSUE = "keras-team/keras#19246"
SUMMARY = (
    "steps_per_execution > 1 fails in fit (and evaluate) on several replicas; "
    "the fused steps run in one loop without a nested per-step function"
)
BUILT_BY_FIX = "_keras_scaling_compat"


def target():
    return _keras_trainer.trainer_class(), "_make_function"


def probe():
    """Whether the installed Keras nests the per-step function in `tf.cond`."""
    trainer = _keras_trainer.trainer_class()
    if trainer is None:
        return False, _keras_source.TRAINER_NOT_FOUND
    if "_make_function" not in trainer.__dict__:
        return False, f"{trainer.__name__} no longer has _make_function"
    source = _keras_source.source_of(trainer._make_function)
    if source is None:
        return _keras_source.by_version("the nested per-step function")
    name = f"{trainer.__name__}._make_function"
    per_step_function = _keras_source.contains(r"one_step_on_data\s*=\s*tf\.function\(", source)
    if per_step_function and _keras_source.contains(r"tf\.cond\(", source):
        return True, f"{name} calls the per-step tf.function inside tf.cond"
    return False, f"{name} no longer calls a per-step tf.function inside tf.cond"


def make_replacement(original_make_function):

    def _make_function(self, step_function):
        keras_function = original_make_function(self, step_function)
        strategy = self.distribute_strategy
        mirrored = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
        function = keras_function
        if not (self.steps_per_execution == 1 or self.run_eagerly or self.jit_compile):
            if isinstance(strategy, mirrored) and _topology.num_replicas(strategy) > 1:
                function = _fused_function(self, step_function, keras_function)
        setattr(function, BUILT_BY_FIX, True)
        return function

    return _make_function


def _fused_function(self, step_function, keras_function):
    """Up to `steps_per_execution` steps per call in one `tf.function`, with Keras' semantics
    (partial last execution, last step's outputs); not unrolled, as each copy would need a tf.cond."""

    def one_step_on_data(data):
        outputs = self.distribute_strategy.run(step_function, args=(data,))
        # Looked up at call time, so that the scalar_reduce fix applies here too.
        return _keras_trainer.module_function("reduce_per_replica")(
            outputs, self.distribute_strategy, reduction="auto"
        )

    # Keras 3.12 and later turn optional inputs into None before the step.
    autoconvert_optionals = getattr(self, "_autoconvert_optionals", None)
    if autoconvert_optionals is not None:
        one_step_on_data = autoconvert_optionals(one_step_on_data)

    @tf.autograph.experimental.do_not_convert
    def multi_step_on_iterator(iterator):
        steps_per_execution = self.steps_per_execution
        # Its element spec becomes known when the loop body is traced.
        empty_outputs = tf.experimental.Optional.empty(None)

        def cond(execution_step, optional_outputs, optional_inputs):
            return tf.logical_and(execution_step < steps_per_execution, optional_inputs.has_value())

        def body(execution_step, optional_outputs, optional_inputs):
            outputs = tf.experimental.Optional.from_value(
                one_step_on_data(optional_inputs.get_value())
            )
            empty_outputs._element_spec = outputs.element_spec
            # Never read beyond this execution's share: the next one starts there.
            optional_inputs = tf.cond(
                tf.less(execution_step + 1, steps_per_execution),
                iterator.get_next_as_optional,
                lambda: optional_inputs,
            )
            return execution_step + 1, outputs, optional_inputs

        loop_vars = [tf.constant(0), empty_outputs, iterator.get_next_as_optional()]
        _, optional_outputs, _ = tf.while_loop(cond, body, loop_vars=loop_vars)
        optional_outputs._element_spec = empty_outputs.element_spec
        return optional_outputs

    multi_step_on_iterator = tf.function(multi_step_on_iterator, reduce_retracing=True)

    def function(iterator):
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            optional_outputs = multi_step_on_iterator(iterator)
            if not optional_outputs.has_value():
                raise StopIteration
            return optional_outputs.get_value()
        # A Python iterator (`train_on_batch`): Keras' step is not inside a tf.cond there.
        return keras_function(iterator)

    return function
