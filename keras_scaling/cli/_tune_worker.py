"""The search of `keras-scaling tune`, in a process of its own.

Run as `python -m keras_scaling.cli._tune_worker ...` by `keras-scaling
tune`: TensorFlow fixes the number of logical CPUs, its thread pools and the
strategy's all-reduce once per process. It splits the CPU
(`keras_scaling.use_logical_cpus` with `--cpu-kwargs`), builds the strategy
(`keras_scaling.auto_strategy` with `--strategy-kwargs`), the model and the
data as the bench's worker does (`_models`), then calls `keras_scaling.tune`
(unless `--serve-only`; with `--serve` it leaves the final side by side to
the command). With `--serve` it then prints `READY` (`keras_scaling.cli.tune`) and serves rounds:
each stdin line is the JSON `{"settings": ..., "steps": N}` and gets the
line `RATE samples_per_sec wall_s`; `quit` or the end of stdin ends it. Bad
input ends it with exit status 2 and a last stderr line starting with
`keras_scaling.cli.tune.USAGE_PREFIX`.
"""

import argparse
import json
import math
import sys
import time

from keras_scaling.cli import _models, _worker
from keras_scaling.cli._errors import UsageError
from keras_scaling.cli.tune import QUIT, RATE, READY, USAGE_PREFIX

# Synthetic samples: enough distinct batches that the pipeline is a real one.
_DISTINCT_BATCHES = 8


def _worker_parser():
    parser = argparse.ArgumentParser(prog="python -m keras_scaling.cli._tune_worker")
    parser.add_argument("--model", required=True)
    parser.add_argument("--data")
    parser.add_argument("--per-replica-batch", type=int, required=True)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--budget", type=float, required=True)
    parser.add_argument("--allow", default="")
    parser.add_argument("--logdir", required=True)
    # The command's start (time.time()): the budget counts from there.
    parser.add_argument("--started-at", type=float, default=None)
    # Seconds of the budget kept for the candidates in processes of their own.
    parser.add_argument("--reserve", type=float, default=0.0)
    parser.add_argument("--strategy-kwargs", default="{}")
    parser.add_argument("--cpu-kwargs", default="{}")
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--serve-only", action="store_true")
    return parser


def _strategy(cpu_kwargs, strategy_kwargs):
    """`auto_strategy(**strategy_kwargs)` on the logical CPUs of `cpu_kwargs`, or on the GPUs."""
    import tensorflow as tf

    import keras_scaling

    if cpu_kwargs:
        tf.config.set_visible_devices([], "GPU")
        keras_scaling.use_logical_cpus(**cpu_kwargs)
    try:
        return keras_scaling.auto_strategy(**strategy_kwargs)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _worker_main(args):
    from keras_scaling.tune import _measure, _search, _tune

    cpu_kwargs = json.loads(args.cpu_kwargs)
    strategy = _strategy(cpu_kwargs, json.loads(args.strategy_kwargs))
    try:
        model = _models.build_compiled(args.model, args.steps_per_execution, strategy)
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
    if not args.serve_only:
        budget_s = args.budget
        if args.started_at is not None:
            budget_s -= time.time() - args.started_at
        budget_s -= args.reserve
        if budget_s < _search.MIN_BUDGET_S:
            raise UsageError(
                f"--budget {args.budget:g} is too small: this start took "
                f"{args.budget - args.reserve - budget_s:.0f} s; pass --budget "
                f"{math.ceil(args.budget - budget_s + 3 * _search.MIN_BUDGET_S)} or more"
            )
        try:
            _tune(
                model,
                data,
                per_replica_batch_size=args.per_replica_batch,
                data_kwargs=data_kwargs,
                strategy=strategy,
                budget_s=budget_s,
                allow=args.allow,
                log_dir=args.logdir,
                verbose=True,
                confirm=not args.serve,
                cpu=cpu_kwargs,
            )
        except _search.BudgetTooSmall as error:
            # The search had what the process start and the all-reduce left of --budget.
            needed_s = math.ceil(args.budget - budget_s + error.needed_s)
            raise UsageError(
                f"--budget {args.budget:g} is too small to measure one candidate "
                f"(this start took {args.budget - args.reserve - budget_s:.0f} s); "
                f"pass --budget {needed_s} or more"
            ) from None
        except ValueError as error:
            raise UsageError(_as_options(str(error))) from None
    if args.serve or args.serve_only:
        _serve(_measure.Runner(model, strategy, data))
    return 0


def _serve(runner):
    """Runs the rounds asked for on stdin, one line each, until `QUIT`."""
    print(READY, flush=True)
    for line in sys.stdin:
        if line.strip() == QUIT:
            break
        request = json.loads(line)
        rate, wall_s = runner.round(request["settings"], int(request["steps"]))
        print(f"{RATE}{rate} {wall_s}", flush=True)


def _as_options(message):
    """A message of `keras_scaling.tune` in the command line's words."""
    return message.replace("budget_s=", "--budget ").replace("allow:", "--allow:")


def main(argv=None):
    return _worker.main(_worker_parser(), _worker_main, USAGE_PREFIX, argv)


if __name__ == "__main__":
    sys.exit(main())
