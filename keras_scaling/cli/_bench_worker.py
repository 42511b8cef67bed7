"""One replica count of `keras-scaling bench`, in a process of its own.

Run as `python -m keras_scaling.cli._bench_worker ...` by the bench, once per
count: `MirroredStrategy` instances with different replica counts in one
process break each other's collective all-reduce, and TensorFlow fixes the
number of logical CPUs once per process.

It trains the model on synthetic data fed through
`keras_scaling.data.distribute`, with `ThroughputLogger(log_dir)`, which
writes `log_dir/throughput.json`. On stdout it prints only progress lines
(`@progress DONE TOTAL`); bad input ends it with exit status 2 and a last
stderr line starting with `USAGE_PREFIX`.
"""

import argparse
import os
import sys

from keras_scaling.cli._errors import UsageError

PROGRESS_PREFIX = "@progress "
USAGE_PREFIX = "keras-scaling bench: error: "
# Each logical CPU device gets its own intra-op pool instead of sharing the
# process-wide one (tensorflow/core/common_runtime/local_device.cc), so
# `--intra-op-threads` is a per-replica budget.
THREADPOOL_ENV = "TF_OVERRIDE_GLOBAL_THREADPOOL"
_DISTINCT_BATCHES = 4
# With --explain: what the count measured, for the bench to gather.
EXPLAIN_FILE = "explain_measurements.json"
_EXPLAIN_ROUNDS = 3


def _parser():
    parser = argparse.ArgumentParser(prog="python -m keras_scaling.cli._bench_worker")
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument("--cpu-devices", action="store_true")
    parser.add_argument("--model", required=True)
    parser.add_argument("--per-replica-batch", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--baseline", default="auto")
    parser.add_argument("--peak-flops", default="auto")
    parser.add_argument("--intra-op-threads", type=int, default=0)
    parser.add_argument("--inter-op-threads", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--data")
    return parser


def _die_with_parent():
    """Ends this process when the bench that started it dies (Linux only)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _configure_tensorflow(args):
    import tensorflow as tf

    # Thread pools are fixed when TensorFlow initialises its devices, so they
    # are set before anything else touches TensorFlow.
    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    if args.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    if args.cpu_devices:
        import keras_scaling

        # A sweep over logical CPUs leaves any GPU alone, so no op lands there.
        tf.config.set_visible_devices([], "GPU")
        devices = keras_scaling.use_logical_cpus(args.replicas)
    else:
        # Only the GPUs this count uses, so the others are left alone.
        gpus = tf.config.list_physical_devices("GPU")
        tf.config.set_visible_devices(gpus[: args.replicas], "GPU")
        devices = [device.name for device in tf.config.list_logical_devices("GPU")]
        if not devices:
            devices = [tf.config.list_logical_devices("CPU")[0].name]
    if len(devices) < args.replicas:
        raise UsageError(
            f"{args.replicas} replicas asked for, but this process sees {len(devices)} device(s)"
        )
    return tf.distribute.MirroredStrategy(devices[: args.replicas])


def _progress_callback(total_steps):

    every = max(1, total_steps // 50)

    from keras_scaling.fit_hooks import _train_function_hook

    done = [0]

    # No batch hook: one would make Keras wait for every step to finish
    # before dispatching the next, and slow the steps being measured.
    def after_execution(model):
        before = done[0]
        done[0] = min(total_steps, before + model.steps_per_execution)
        if done[0] // every > before // every or done[0] == total_steps:
            print(f"{PROGRESS_PREFIX}{done[0]} {total_steps}", flush=True)

    return _train_function_hook.execution_callback(after_execution)


def _baseline(text):
    if text in ("auto", "measure"):
        return text
    try:
        return float(text)
    except ValueError:
        return text


def _peak_flops(text):
    if text in ("auto", "measure"):
        return text
    return float(text)


def run(args):
    """Trains one replica count; returns the process exit status."""
    import tensorflow as tf

    from keras_scaling import callbacks, compat, data
    from keras_scaling.cli import _models

    strategy = _configure_tensorflow(args)
    compat.enable_for(strategy)
    with strategy.scope():
        model = _models.build_model(args.model)
        _models.compile_for_bench(model, args.model, args.steps_per_execution)
    global_batch_size = args.per_replica_batch * args.replicas
    if args.data is not None:
        # The user's own pipeline, as training would build it: its cost is
        # part of the step.
        dataset = data.distribute(
            _models.load_data(args.data),
            strategy=strategy,
            per_replica_batch_size=args.per_replica_batch,
            last_batch="drop",
        ).repeat()
    else:
        x, y = _models.synthetic_data(model, global_batch_size * _DISTINCT_BATCHES, seed=args.seed)
        dataset = data.distribute(
            (x, y),
            strategy=strategy,
            per_replica_batch_size=args.per_replica_batch,
            shuffle=False,
            last_batch="drop",
        )
        # The few distinct batches are assembled once and then replayed, so the
        # input pipeline costs the same at every count and the steps measure training.
        dataset = dataset.cache().repeat().prefetch(tf.data.AUTOTUNE)
    logger = callbacks.ThroughputLogger(
        args.log_dir,
        baseline=_baseline(args.baseline),
        global_batch_size=global_batch_size,
        peak_flops=_peak_flops(args.peak_flops),
    )
    logger._command_line = True  # what it says names --peak-flops, not peak_flops=
    model.fit(
        dataset,
        steps_per_epoch=args.steps,
        epochs=1,
        verbose=0,
        shuffle=False,
        callbacks=[logger, _progress_callback(args.steps)],
    )
    if not os.path.exists(os.path.join(args.log_dir, "throughput.json")):
        print(
            f"ThroughputLogger wrote no throughput.json in {args.log_dir}",
            file=sys.stderr,
        )
        return 1
    if args.explain:
        _explain(model, dataset, strategy, args)
    return 0


def _explain(model, dataset, strategy, args):
    """Measures the split of this count's step into `EXPLAIN_FILE`."""
    import json

    from keras_scaling.explain import _measure, _report

    measurements = _measure.measure(
        model, dataset, strategy, steps=args.steps, rounds=_EXPLAIN_ROUNDS
    )
    compute_s = _report.explanation(measurements).split.part("compute").time_s
    mfu, reason = _measure.compute_mfu(
        model,
        strategy,
        _peak_flops(args.peak_flops),
        measurements["per_replica_batch_size"],
        compute_s,
    )
    path = os.path.join(args.log_dir, EXPLAIN_FILE)
    with open(path, "w", encoding="utf-8") as file:
        json.dump({"measurements": measurements, "mfu": mfu, "mfu_reason": reason}, file)


def main(argv=None):
    args = _parser().parse_args(argv)
    _die_with_parent()
    if args.cpu_devices:
        os.environ.setdefault(THREADPOOL_ENV, "1")
    try:
        return run(args)
    except UsageError as error:
        print(f"{USAGE_PREFIX}{error}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
