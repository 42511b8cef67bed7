"""One replica count of `keras-scaling bench`, in a process of its own; stdout carries only `@progress DONE TOTAL` lines."""

import argparse
import json
import os
import sys

from keras_scaling.cli import _models, _worker
from keras_scaling.cli._errors import UsageError

PROGRESS_PREFIX = "@progress "
USAGE_PREFIX = "keras-scaling bench: error: "
# Gives each logical CPU its own intra-op pool (`keras_scaling.use_logical_cpus`).
THREADPOOL_ENV = "TF_OVERRIDE_GLOBAL_THREADPOOL"
# With --explain: what the count measured, for the bench to gather.
EXPLAIN_FILE = "explain_measurements.json"
_DISTINCT_BATCHES = 4
_EXPLAIN_ROUNDS = 3


def _parser():
    parser = argparse.ArgumentParser(prog="python -m keras_scaling.cli._bench_worker")
    for name in ("--replicas", "--per-replica-batch", "--steps"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    for name in ("--intra-op-threads", "--inter-op-threads", "--seed"):
        parser.add_argument(name, type=int, default=0)
    parser.add_argument("--baseline", default="auto")
    parser.add_argument("--peak-flops", default="auto")
    parser.add_argument("--cpu-devices", action="store_true")
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--data")
    return parser


def _strategy(args):
    import tensorflow as tf

    import keras_scaling

    if args.cpu_devices:
        tf.config.set_visible_devices([], "GPU")
        devices = keras_scaling.use_logical_cpus(
            args.replicas,
            threads_per_device=args.intra_op_threads,
            inter_op_threads=args.inter_op_threads,
        )
    else:
        # Only the GPUs this count uses, so the others are left alone.
        tf.config.set_visible_devices(
            tf.config.list_physical_devices("GPU")[: args.replicas], "GPU"
        )
        devices = [device.name for device in tf.config.list_logical_devices("GPU")]
        devices = devices or [tf.config.list_logical_devices("CPU")[0].name]
    if len(devices) < args.replicas:
        raise UsageError(
            f"{args.replicas} replicas asked for, but this process sees {len(devices)} device(s)"
        )
    return tf.distribute.MirroredStrategy(devices[: args.replicas])


def _progress_callback(total_steps):
    from keras_scaling.fit_hooks import _train_function_hook

    every = max(1, total_steps // 50)
    done = [0]

    # No batch hook: one would make Keras wait for every step to finish
    # before dispatching the next, and slow the steps being measured.
    def after_execution(model):
        before = done[0]
        done[0] = min(total_steps, before + model.steps_per_execution)
        if done[0] // every > before // every or done[0] == total_steps:
            print(f"{PROGRESS_PREFIX}{done[0]} {total_steps}", flush=True)

    return _train_function_hook.execution_callback(after_execution)


def number_or_word(text):
    """`auto` and `measure` stay words; a number becomes a float; a path stays a path."""
    try:
        return float(text)
    except ValueError:
        return text


def run(args):
    """Trains one replica count; returns the process exit status."""
    import tensorflow as tf

    from keras_scaling import callbacks, compat, data

    strategy = _strategy(args)
    compat.enable_for(strategy)
    model = _models.build_compiled(args.model, args.steps_per_execution, strategy)
    global_batch_size = args.per_replica_batch * args.replicas
    if args.data is not None:
        source, shuffle = _models.load_data(args.data), None
    else:
        source = _models.synthetic_data(
            model, global_batch_size * _DISTINCT_BATCHES, seed=args.seed
        )
        shuffle = False
    dataset = data.distribute(
        source,
        strategy=strategy,
        per_replica_batch_size=args.per_replica_batch,
        last_batch="drop",
        shuffle=shuffle,
    )
    # The user's pipeline costs what it costs in training; the few synthetic
    # batches are made once and replayed, so they cost the same at every count.
    if args.data is not None:
        dataset = dataset.repeat()
    else:
        dataset = dataset.cache().repeat().prefetch(tf.data.AUTOTUNE)
    peak_flops = number_or_word(args.peak_flops)
    logger = callbacks.ThroughputLogger(
        args.log_dir,
        baseline=number_or_word(args.baseline),
        global_batch_size=global_batch_size,
        peak_flops=peak_flops,
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
    if args.explain:
        from keras_scaling.explain import _measure, _report

        measurements = _measure.measure(
            model, dataset, strategy, steps=args.steps, rounds=_EXPLAIN_ROUNDS
        )
        compute_s = _report.explanation(measurements).split.part("compute").time_s
        mfu, reason = _measure.compute_mfu(
            model, strategy, peak_flops, measurements["per_replica_batch_size"], compute_s
        )
        with open(os.path.join(args.log_dir, EXPLAIN_FILE), "w", encoding="utf-8") as file:
            json.dump({"measurements": measurements, "mfu": mfu, "mfu_reason": reason}, file)
    return 0


def main(argv=None):
    return _worker.main(_parser(), run, USAGE_PREFIX, argv)


if __name__ == "__main__":
    sys.exit(main())
