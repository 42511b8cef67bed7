"""The search of `keras-scaling tune`, in a process of its own.

Run as `python -m keras_scaling.cli._tune_worker ...` by `keras-scaling
tune`: TensorFlow fixes the number of logical CPUs and its thread pools once
per process. It builds the strategy, the model and the data as the bench's
worker does (`_bench_worker`, `_models`) and calls `keras_scaling.tune`; bad
input ends it with exit status 2 and a last stderr line starting with
`keras_scaling.cli.tune.USAGE_PREFIX`.
"""

import argparse
import sys
import types

from keras_scaling.cli import _bench_worker, _models, _sweep_plan
from keras_scaling.cli._errors import UsageError
from keras_scaling.cli.tune import USAGE_PREFIX

# Synthetic samples: enough distinct batches that the pipeline is a real one.
_DISTINCT_BATCHES = 8


def _worker_parser():
    parser = argparse.ArgumentParser(prog="python -m keras_scaling.cli._tune_worker")
    parser.add_argument("--model", required=True)
    parser.add_argument("--data")
    parser.add_argument("--cpu-devices", type=int)
    parser.add_argument("--per-replica-batch", type=int, required=True)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--budget", type=float, required=True)
    parser.add_argument("--allow", default="")
    parser.add_argument("--logdir", required=True)
    return parser


def _strategy(cpu_devices):
    """The strategy as the bench makes it, with the bench's thread pools on logical CPUs."""
    import tensorflow as tf

    replicas = cpu_devices or max(1, len(tf.config.list_physical_devices("GPU")))
    threads = None
    if cpu_devices:
        threads = _sweep_plan.plan_cpu_threads([cpu_devices], _sweep_plan.available_cores())
    config = types.SimpleNamespace(
        replicas=replicas,
        cpu_devices=bool(cpu_devices),
        intra_op_threads=threads.intra_op_threads() if threads else 0,
        inter_op_threads=threads.inter_op_threads(replicas) if threads else 0,
    )
    return _bench_worker._configure_tensorflow(config)


def _worker(args):
    from keras_scaling.tune import tune

    strategy = _strategy(args.cpu_devices)
    try:
        with strategy.scope():
            model = _models.build_model(args.model)
            _models.compile_for_bench(model, args.model, args.steps_per_execution)
    except UsageError:
        raise
    except Exception as error:
        raise UsageError(
            f"--model {args.model!r} could not be built ({type(error).__name__}: {error}); "
            "fix the function so that it returns a keras.Model with known input shapes"
        ) from None
    num_replicas = strategy.num_replicas_in_sync
    if args.data is not None:
        data = _models.load_data(args.data)
        data_kwargs = {}
    else:
        data = _models.synthetic_data(
            model, args.per_replica_batch * num_replicas * _DISTINCT_BATCHES
        )
        data_kwargs = {"shuffle": False}
    try:
        tune(
            model,
            data,
            per_replica_batch_size=args.per_replica_batch,
            data_kwargs=data_kwargs,
            strategy=strategy,
            budget_s=args.budget,
            allow=args.allow,
            log_dir=args.logdir,
        )
    except ValueError as error:
        raise UsageError(_as_options(str(error))) from None
    return 0


def _as_options(message):
    """A message of `keras_scaling.tune` in the command line's words."""
    return message.replace("budget_s=", "--budget ").replace("allow:", "--allow:")


def main(argv=None):
    args = _worker_parser().parse_args(argv)
    _bench_worker._die_with_parent()
    try:
        return _worker(args)
    except UsageError as error:
        print(f"{USAGE_PREFIX}{error}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
