"""A multi-worker strategy's all-reduce options, read and set between the traces of its train functions."""

import tensorflow as tf

from keras_scaling.internals import _probes


@_probes.guarded(
    "tf.distribute.communication_options",
    reaches="CollectiveAllReduceExtended._communication_options",
    lost="tune does not search the all-reduce across workers (communication, bytes_per_pack)",
    workaround="Compare runs of keras_scaling.auto_strategy(communication=..., bytes_per_pack=...) by hand.",
)
def communication_options(strategy):
    """The `CommunicationOptions` a `MultiWorkerMirroredStrategy` traces its all-reduces with, or None."""
    options = strategy.extended._communication_options
    # The exported name makes instances of a private class.
    if not isinstance(options, type(tf.distribute.experimental.CommunicationOptions())):
        raise _probes.ReachError(
            f"_communication_options is a {type(options).__name__}, not CommunicationOptions"
        )
    return options


def set_communication_options(strategy, options):
    """Makes `options` those of the all-reduces traced from now on; call after `communication_options` gave options."""
    strategy.extended._communication_options = options
