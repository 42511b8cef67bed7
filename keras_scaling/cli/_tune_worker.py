"""The search of `keras-scaling tune`, in a process of its own.

After its search (`--serve`), or at once (`--serve-only`), it prints `READY` and answers
each stdin line `{"settings": ..., "steps": N}` with `RATE samples_per_sec wall_s`, or
`FAILED` and why, until `QUIT`.
"""

import argparse
import json
import math
import sys
import time

from keras_scaling.cli import _models, _worker
from keras_scaling.cli._errors import UsageError
from keras_scaling.cli.tune import FAILED, QUIT, RATE, READY, USAGE_PREFIX

# Synthetic samples: enough distinct batches that the pipeline is a real one.
_DISTINCT_BATCHES = 8


def _worker_parser():
    parser = argparse.ArgumentParser(prog="python -m keras_scaling.cli._tune_worker")
    add = parser.add_argument
    add("--model", required=True)
    add("--data")
    add("--per-replica-batch", type=int, required=True)
    add("--steps-per-execution", type=int, default=1)
    add("--budget", type=float, required=True)
    add("--allow", default="")
    add("--logdir", required=True)
    add("--started-at", type=float, default=time.time())  # the budget's start
    add("--reserve", type=float, default=0.0)  # seconds kept for the command's own rounds
    add("--strategy-kwargs", default="{}")
    add("--cpu-kwargs", default="{}")
    add("--serve", action="store_true")
    add("--serve-only", action="store_true")
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
    if args.data is not None:
        data, data_kwargs = _models.load_data(args.data), {}
    else:
        num_samples = args.per_replica_batch * strategy.num_replicas_in_sync * _DISTINCT_BATCHES
        data, data_kwargs = _models.synthetic_data(model, num_samples), {"shuffle": False}
    if not args.serve_only:
        budget_s = args.budget - (time.time() - args.started_at) - args.reserve
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
        except ValueError as error:  # in the command line's words
            message = str(error).replace("budget_s=", "--budget ").replace("allow:", "--allow:")
            raise UsageError(message) from None
    if args.serve or args.serve_only:
        _serve(_measure.Runner(model, strategy, data))
    return 0


def _serve(runner):
    """Runs the rounds asked for on stdin, one line each, until `QUIT`."""
    from keras_scaling.tune import _search

    print(READY, flush=True)
    for line in sys.stdin:
        if line.strip() == QUIT:
            break
        request = json.loads(line)
        try:
            rate, wall_s = runner.round(request["settings"], int(request["steps"]))
        except Exception as error:  # a setting this model cannot run: the incumbent's still can
            print(f"{FAILED}{_search.first_line(error)}", flush=True)
            continue
        print(f"{RATE}{rate} {wall_s}", flush=True)


def main(argv=None):
    return _worker.main(_worker_parser(), _worker_main, USAGE_PREFIX, argv)


if __name__ == "__main__":
    sys.exit(main())
