"""Worker of the multi-worker wrapping test: every source of data_wrapping_sources.

Run under `keras-scaling launch --workers 2 --cpu-devices 2 -- python
mw_data_wrapping_worker.py OUT_DIR DATA_DIR`. For each source, reads one epoch
of `distribute(source, last_batch="pad")` through the strategy (the ids of
the real samples each local replica got, the steps, the per-replica batch
sizes), then trains one epoch with `fit`; writes `worker{i}.json` to OUT_DIR.
"""

import json
import os
import sys

import keras_scaling
from keras_scaling import data

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers"))
import data_wrapping_sources as sources  # noqa: E402


def read_one_epoch(strategy, dataset, name):
    ids_of = sources.SOURCES[name][1]
    steps, ids, replica_batch_sizes = 0, [], set()
    for x, y, weights in strategy.experimental_distribute_dataset(dataset):
        steps += 1
        for parts in zip(*(strategy.experimental_local_results(part) for part in (x, y, weights))):
            x_part, y_part, weights_part = (part.numpy() for part in parts)
            replica_batch_sizes.add(len(y_part))
            real = weights_part > 0
            ids.extend(ids_of(x_part[real], y_part[real]))
    return steps, ids, sorted(replica_batch_sizes)


def main():
    wrap(keras_scaling.auto_strategy(), sys.argv[1], sys.argv[2])
    # Skips TensorFlow's shutdown barrier, which waits ~20 s for the cluster.
    os._exit(0)


def wrap(strategy, out_dir, data_dir):
    info = keras_scaling.describe_strategy(strategy)
    report = {
        "worker_index": info.worker_index,
        "num_replicas": info.num_replicas,
        "sources": {},
    }
    for name in sources.SOURCES:
        source, kwargs = sources.make_source(name, data_dir)
        dataset = data.distribute(source, strategy=strategy, last_batch="pad", **kwargs)
        plan = data.plan_of(dataset)
        steps, ids, replica_batch_sizes = read_one_epoch(strategy, dataset, name)

        source, kwargs = sources.make_source(name, data_dir)
        train = data.distribute(source, strategy=strategy, **kwargs)
        with strategy.scope():
            model = sources.make_model(name)
        counter = sources.CountSteps()
        history = model.fit(sources.for_fit(name, train), epochs=1, verbose=0, callbacks=[counter])
        report["sources"][name] = {
            "steps": steps,
            "planned_steps": plan.steps_per_epoch,
            "per_replica_batch_size": plan.per_replica_batch_size,
            "global_batch_size": plan.global_batch_size,
            "shard_mode": plan.shard_mode,
            "replica_batch_sizes": replica_batch_sizes,
            "ids": ids,
            "fit_steps": counter.steps,
            "fit_planned_steps": data.plan_of(train).steps_per_epoch,
            "loss": float(history.history["loss"][-1]),
        }
        if name == "py_dataset":
            report["sources"][name]["epochs_begun"] = source.epochs_begun
            report["sources"][name]["epochs_ended"] = source.epochs_ended
    path = os.path.join(out_dir, f"worker{info.worker_index}.json")
    with open(path + ".partial", "w") as file:
        json.dump(report, file)
    os.replace(path + ".partial", path)


if __name__ == "__main__":
    main()
