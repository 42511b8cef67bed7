"""How many packs TensorFlow's all-reduce makes of the gradients, as its INFO log says when it traces one."""

import contextlib
import logging


@contextlib.contextmanager
def traced_packs(gradients):
    """Yields a list that gets the pack count of each all-reduce of `gradients` tensors traced meanwhile."""
    import tensorflow as tf

    prefix = f"Collective all_reduce tensors: {gradients} all_reduces"
    packs = []

    class PackLog(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            if message.startswith(prefix):
                packs.append(int(message.rsplit("num_packs = ", 1)[1]))

    logger, log = tf.get_logger(), PackLog(logging.INFO)
    level = logger.level
    logger.addHandler(log)
    logger.setLevel(logging.INFO)
    try:
        yield packs
    finally:
        logger.removeHandler(log)
        logger.setLevel(level)
