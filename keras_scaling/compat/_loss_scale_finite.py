"""Fix: `LossScaleOptimizer` decides from one replica's gradients, before the all-reduce, whether
a step overflowed (the first replica's answer, with a merge call); the answer is all-reduced."""

import keras
import tensorflow as tf

from keras_scaling.compat import _keras_source

NAME = "loss_scale_finite"
ISSUE = "no upstream issue"
SUMMARY = (
    "under mixed_float16, a LossScaleOptimizer applies a step whose gradients overflowed on a "
    "replica but the first (the weights become NaN); any replica's overflow now skips the step"
)


def target():
    return keras.optimizers.LossScaleOptimizer, "check_finite"


def probe():
    """Whether the installed Keras checks each replica's gradients alone."""
    check_finite = keras.optimizers.LossScaleOptimizer.__dict__.get("check_finite")
    if check_finite is None:
        return False, "LossScaleOptimizer.check_finite is gone"
    source = _keras_source.source_of(check_finite)
    if source is None:
        return _keras_source.by_version(
            "the check of one replica's gradients", upstream_issue_open=False
        )
    if _keras_source.contains(r"all_reduce|reduce_to|\.reduce\(", source):
        return False, "check_finite combines the replicas' answers"
    return True, "check_finite reads one replica's gradients, before the all-reduce"


def make_replacement(original_check_finite):

    def check_finite(self, grads):
        finite = original_check_finite(self, grads)
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return finite
        not_finite = tf.cast(tf.logical_not(finite), tf.float32)
        return tf.equal(context.all_reduce(tf.distribute.ReduceOp.SUM, not_finite), 0.0)

    return check_finite
