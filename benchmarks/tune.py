"""Does `keras-scaling tune` find real gains, and report them truly? Two models, each checked by `fit`.

For each model (the bench's host-bound `mlp` and compute-bound `cnn`, at
per-replica 128 on 2 logical CPUs), it runs `keras-scaling tune` within its
budget, then confirms the result independently: a process of its own (the
same thread pools as tune's, each setting's all-reduce through
`keras_scaling.auto_strategy(**settings["strategy"])`) trains one model
compiled with the start's settings and one with the best, in alternating
rounds of a plain `model.fit` on `keras_scaling.data.distribute` data. A
round is one `fit` of 3 epochs of about 1.5 s each at the start's speed;
its figure is the samples of the last 2 epochs over their wall time, taken
by the benchmark's own clock at the epochs' ends (the first epoch holds the
iterator's start; garbage is collected before each call). It shares
nothing with tune's measuring code but the model and data presets. It prints
the medians, the spread, the independent ratio (median of the paired
ratios), tune's own ratio and their agreement, and whether the tune kept
within its budget.

It also measures the ceiling of any setting that keeps the model's
arithmetic: the model's forward and backward pass alone (no optimizer, no
all-reduce, no input pipeline), one process per replica with one thread
each, all running at once, the samples/sec summed. A goal above it cannot be
met by any such setting on this machine.

    python benchmarks/tune.py                   # about 10 minutes
    python benchmarks/tune.py --models mlp --budget 60
    python benchmarks/tune.py --tune-json mlp=logs/tune/tune.json   # confirm only
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_ROUNDS = 7
# Seconds of one timed epoch at the start's speed, and epochs of a round
# (the first one untimed).
_EPOCH_S = 1.5
_EPOCHS = 3


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], help="default mlp cnn")
    parser.add_argument("--budget", type=float, default=180.0, help="seconds per tune (180)")
    parser.add_argument("--per-replica-batch", type=int, default=128, help="default 128")
    parser.add_argument("--replicas", type=int, default=2, help="logical CPUs (default 2)")
    parser.add_argument("--rounds", type=int, default=_ROUNDS, help=f"default {_ROUNDS}")
    parser.add_argument("--confirm", help=argparse.SUPPRESS)  # the confirming child
    parser.add_argument("--ceiling", help=argparse.SUPPRESS)  # an arithmetic-ceiling child
    parser.add_argument(
        "--tune-json",
        metavar="MODEL=PATH",
        nargs="+",
        default=[],
        help="confirm these tune.json files of earlier runs instead of tuning again",
    )
    return parser.parse_args(argv)


def _half_range_share(values):
    return (max(values) - min(values)) / 2 / statistics.median(values)


def confirm(args):
    """The child: start against best by plain `fit`, alternating; prints one JSON line."""
    from keras_scaling.cli import _bench_worker, _models, _sweep_plan

    os.environ.setdefault(_bench_worker.THREADPOOL_ENV, "1")
    with open(args.confirm, encoding="utf-8") as file:
        record = json.load(file)
    import keras
    import tensorflow as tf

    import keras_scaling

    threads = _sweep_plan.plan_cpu_threads([args.replicas], _sweep_plan.available_cores())
    tf.config.threading.set_intra_op_parallelism_threads(threads.intra_op_threads())
    tf.config.threading.set_inter_op_parallelism_threads(threads.inter_op_threads(args.replicas))
    keras_scaling.use_logical_cpus(args.replicas)
    model_name = record["model"]
    settings = {which: record[which]["settings"] for which in ("start", "best")}
    models, datasets, strategies = {}, {}, {}
    for which, setting in settings.items():
        # As the user applies it: the all-reduce by name. TensorFlow's own is
        # collective, and two collective strategies in one process break each
        # other's all-reduce: equal settings share one strategy.
        key = json.dumps(setting["strategy"], sort_keys=True)
        if key not in strategies:
            strategies[key] = keras_scaling.auto_strategy(**setting["strategy"])
        strategy = strategies[key]
        with strategy.scope():
            # Compiled as the bench and tune compile it, with the setting's own.
            model = _models.build_model(model_name)
            _models.compile_for_bench(model, model_name, setting["compile"]["steps_per_execution"])
            model.jit_compile = setting["compile"]["jit_compile"]
        models[which] = model
        data_kwargs = setting["data"]
        global_batch = data_kwargs["per_replica_batch_size"] * args.replicas
        x, y = _models.synthetic_data(model, global_batch * 8)
        datasets[which] = keras_scaling.data.distribute(
            (x, y), strategy=strategy, **data_kwargs
        ).repeat()
    multiple = max(settings[which]["compile"]["steps_per_execution"] for which in settings)
    for which in settings:  # traces, and the first epoch's start
        models[which].fit(datasets[which], steps_per_epoch=multiple, epochs=1, verbose=0)

    class EpochEnds(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.ends_s = []

        def on_epoch_end(self, epoch, logs=None):
            self.ends_s.append(time.perf_counter())

    # The start's step, from the second epoch of a fit: the first holds the
    # fit call's own cost, which would make the rounds too short.
    sizing_steps = multiple * max(1, -(-64 // multiple))
    ends = EpochEnds()
    models["start"].fit(
        datasets["start"], steps_per_epoch=sizing_steps, epochs=2, verbose=0, callbacks=[ends]
    )
    step_s = (ends.ends_s[1] - ends.ends_s[0]) / sizing_steps
    steps = multiple * max(1, round(_EPOCH_S / step_s / multiple))

    rates = {which: [] for which in settings}
    for index in range(args.rounds):
        order = list(settings) if index % 2 == 0 else list(reversed(list(settings)))
        for which in order:
            global_batch = settings[which]["data"]["per_replica_batch_size"] * args.replicas
            # The last round's iterators are freed here, not inside a timed
            # fit: freeing one can wait for its autotuning thread.
            gc.collect()
            ends = EpochEnds()
            models[which].fit(
                datasets[which], steps_per_epoch=steps, epochs=_EPOCHS, verbose=0, callbacks=[ends]
            )
            timed_s = ends.ends_s[-1] - ends.ends_s[0]
            rates[which].append((_EPOCHS - 1) * steps * global_batch / timed_s)
    print(json.dumps({**rates, "steps_per_epoch": steps}))


def ceiling(args):
    """The child: one replica's forward and backward pass on one thread; prints its samples/sec."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from keras_scaling.cli import _models

    model = _models.build_model(args.ceiling)
    _models.compile_for_bench(model, args.ceiling, 1)
    x, y = _models.synthetic_data(model, args.per_replica_batch)
    x, y = tf.constant(x), tf.constant(y)

    @tf.function
    def steps(n):
        total = tf.constant(0.0)
        for _ in tf.range(n):
            with tf.GradientTape() as tape:
                loss = model.loss(y, model(x, training=True))
            gradients = tape.gradient(loss, model.trainable_variables)
            # Kept alive: nothing of the pass may be pruned as unused.
            total += tf.add_n([tf.reduce_sum(gradient) for gradient in gradients])
        return total

    steps(tf.constant(2)).numpy()
    started_s = time.perf_counter()
    steps(tf.constant(4)).numpy()
    n = max(4, round(4 * 1.0 / (time.perf_counter() - started_s)))  # about 1 s a round
    rates = []
    for _ in range(args.rounds):
        started_s = time.perf_counter()
        steps(tf.constant(n)).numpy()
        rates.append(n * args.per_replica_batch / (time.perf_counter() - started_s))
    print(json.dumps({"samples_per_sec": statistics.median(rates)}))


def _arithmetic_ceiling(model, args):
    """Samples/sec of `args.replicas` single-thread forward and backward passes at once, summed."""
    command = [sys.executable, __file__, f"--ceiling={model}", f"--rounds={args.rounds}"]
    command.append(f"--per-replica-batch={args.per_replica_batch}")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(args.replicas)
    ]
    outputs = [process.communicate()[0] for process in processes]
    if any(process.returncode for process in processes):
        raise RuntimeError(f"an arithmetic-ceiling process of {model} failed")
    return sum(json.loads(output.strip().splitlines()[-1])["samples_per_sec"] for output in outputs)


def _run_tune(model, args, log_dir):
    command = [
        sys.executable,
        "-m",
        "keras_scaling",
        "tune",
        f"--cpu-devices={args.replicas}",
        f"--model={model}",
        f"--per-replica-batch={args.per_replica_batch}",
        f"--budget={args.budget:g}",
        f"--logdir={log_dir}",
    ]
    started_s = time.perf_counter()
    subprocess.run(command, check=True)
    wall_s = time.perf_counter() - started_s
    with open(os.path.join(log_dir, "tune.json"), encoding="utf-8") as file:
        return json.load(file), wall_s


def _confirm(model, record, args, directory):
    path = os.path.join(directory, f"{model}_confirm.json")
    with open(path, "w", encoding="utf-8") as file:
        json.dump({"model": model, **record}, file)
    output = subprocess.run(
        [
            sys.executable,
            __file__,
            f"--confirm={path}",
            f"--replicas={args.replicas}",
            f"--rounds={args.rounds}",
        ],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def main(argv=None):
    args = parse_args(argv)
    if args.confirm:
        confirm(args)
        return 0
    if args.ceiling:
        ceiling(args)
        return 0
    results = []
    with tempfile.TemporaryDirectory() as directory:
        earlier = dict(item.split("=", 1) for item in args.tune_json)
        for model in earlier or args.models:
            if model in earlier:
                with open(earlier[model], encoding="utf-8") as file:
                    record, wall_s = json.load(file), float("nan")
            else:
                print(f"\n=== keras-scaling tune --model {model} ===", flush=True)
                record, wall_s = _run_tune(model, args, os.path.join(directory, model))
            rates = _confirm(model, record, args, directory)
            start, best = rates["start"], rates["best"]
            ratios = [b / s for s, b in zip(start, best)]
            rates["ceiling"] = _arithmetic_ceiling(model, args)
            results.append((model, record, wall_s, start, best, statistics.median(ratios), rates))
    print("\n=== tune against an independent fit (medians over alternating rounds) ===")
    for model, record, wall_s, start, best, independent, rates in results:
        reported = record["best"]["ratio_to_start"]
        changed = record["best"]["settings"] != record["start"]["settings"]
        print(f"\n{model}: best {json.dumps(record['best']['settings'])}")
        print(
            f"  tune: {record['elapsed_s']:.0f} s of a {record['budget_s']:g} s budget "
            f"({wall_s:.0f} s with the process start); "
            f"{'within' if record['elapsed_s'] <= record['budget_s'] else 'OVER'} budget"
        )
        print(
            f"  independent fit: start {statistics.median(start):,.0f} samples/sec "
            f"(±{_half_range_share(start):.0%}), best {statistics.median(best):,.0f} "
            f"(±{_half_range_share(best):.0%}), ratio {independent:.2f}x "
            f"over {len(start)} rounds of {_EPOCHS - 1} epochs of {rates['steps_per_epoch']} steps"
        )
        ceiling_rate, start_rate = rates["ceiling"], statistics.median(start)
        print(
            f"  arithmetic ceiling: {ceiling_rate:,.0f} samples/sec (forward and backward alone, "
            f"{args.replicas} single-thread processes at once); the start is at "
            f"{start_rate / ceiling_rate:.0%} of it, the best at "
            f"{statistics.median(best) / ceiling_rate:.0%}; 1.5x the start would be "
            f"{1.5 * start_rate / ceiling_rate:.0%} of it"
        )
        timeline = {
            key: round(value) if isinstance(value, (int, float)) else value
            for key, value in record.get("timeline_s", {}).items()
        }
        print(f"  tune's timeline (s): {json.dumps(timeline)}; notes: {record['notes']}")
        if changed:
            agreement = reported / independent
            print(
                f"  tune reported {reported:.2f}x ({record['best']['ratio_source']}): "
                f"{agreement:.2f} of the independent ratio "
                f"({'within' if abs(agreement - 1) <= 0.2 else 'outside'} 20%)"
            )
        else:
            print("  tune: nothing worth changing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
