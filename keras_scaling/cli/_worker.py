"""Start-up shared by the worker processes of `keras-scaling bench` and `tune`."""

import os
import sys

from keras_scaling.cli._errors import UsageError

# Each logical CPU device gets its own intra-op pool instead of sharing the
# process-wide one (tensorflow/core/common_runtime/local_device.cc), so the
# intra-op threads are a per-replica budget. Read when the devices are made.
THREADPOOL_ENV = "TF_OVERRIDE_GLOBAL_THREADPOOL"


def main(parser, run, usage_prefix, argv=None):
    """Parses `argv`, ties the process to its parent and returns `run(args)`'s exit status.

    A `UsageError` becomes exit status 2 and a last stderr line `usage_prefix + message`.
    """
    args = parser.parse_args(argv)
    _die_with_parent()
    try:
        return run(args)
    except UsageError as error:
        print(f"{usage_prefix}{error}", file=sys.stderr, flush=True)
        return 2


def _die_with_parent():
    """Ends this process with SIGTERM when its parent dies (Linux only)."""
    try:
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def use_cpus(count, intra_op_threads, inter_op_threads):
    """Hides the GPUs and splits the CPU into `count` logical devices, each with its own pool.

    Returns the devices' names. Call it first: TensorFlow fixes its pools when it makes devices.
    """
    os.environ.setdefault(THREADPOOL_ENV, "1")
    import tensorflow as tf

    import keras_scaling

    tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
    tf.config.set_visible_devices([], "GPU")
    return keras_scaling.use_logical_cpus(count)
