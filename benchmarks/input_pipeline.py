"""Input pipeline speed: distribute() against hand-written tf.data and fit's NumPy path.

All three pipelines read the same in-memory arrays with the same global batch
and shuffle every epoch:

- `distribute`: `keras_scaling.data.distribute((x, y), ...)`.
- `hand-written`: `from_tensor_slices((x, y)).shuffle(n).batch(g,
  drop_remainder=True).prefetch(AUTOTUNE)`, the usual tf.data recipe.
- `fit NumPy path`: the `tf.data.Dataset` that Keras' own array adapter
  (`keras.src.trainers.data_adapters.get_data_adapter`) builds when
  `model.fit(x, y, batch_size=g)` is called, which is what `fit` iterates on
  the TensorFlow backend.

Each pipeline is iterated the way Keras iterates it under the strategy
(`strategy.experimental_distribute_dataset`, one `tf.function` step per
batch, a new iterator each epoch) with a trivial step instead of a model, so
the figures are input throughput only. One warm-up epoch, then the median of the timed
epochs is reported as batches per second, and as a ratio to the hand-written
pipeline (above 1 means faster).

Usage:

    python benchmarks/input_pipeline.py [--quick] [--replicas 2]
"""

import argparse
import statistics
import time

import keras_scaling


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data, 2 timed epochs")
    parser.add_argument("--replicas", type=int, default=2, help="logical CPU replicas")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--per-replica-batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=None, help="timed epochs")
    return parser.parse_args()


def _time_epochs(strategy, dataset, steps, epochs):
    """Iterates the distributed dataset as Keras' train step does.

    Each step is a `tf.function` that takes the next distributed batch and
    runs a trivial function on every replica, so the input, not a model,
    sets the pace. Returns (batches per epoch, seconds per timed epoch); an
    epoch's time includes creating its iterator, as in `fit`.
    """
    import tensorflow as tf

    distributed = strategy.experimental_distribute_dataset(dataset)

    @tf.function
    def step(iterator):
        batch = next(iterator)
        return strategy.run(lambda x, *_: tf.reduce_sum(tf.cast(x, tf.float32)), args=batch)

    seconds, batches = [], 0
    for epoch in range(epochs + 1):
        start = time.perf_counter()
        iterator = iter(distributed)
        batches = 0
        for _ in range(steps):
            strategy.experimental_local_results(step(iterator))[0].numpy()
            batches += 1
        if epoch > 0:  # the first epoch is warm-up (buffers, tracing)
            seconds.append(time.perf_counter() - start)
    return batches, seconds


def main():
    args = _parse_args()
    keras_scaling.use_logical_cpus(args.replicas)
    import numpy as np
    import tensorflow as tf
    from keras.src.trainers.data_adapters import get_data_adapter

    from keras_scaling import data

    samples = args.samples or (20_000 if args.quick else 200_000)
    epochs = args.epochs or (2 if args.quick else 5)
    strategy = keras_scaling.auto_strategy()
    global_batch_size = data.global_batch_size(args.per_replica_batch_size, strategy)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, args.features)).astype("float32")
    y = rng.integers(0, 10, size=(samples,)).astype("int64")

    fit_adapter = get_data_adapter(x, y, batch_size=global_batch_size, shuffle=True)
    pipelines = {
        "distribute": data.distribute(
            (x, y), strategy=strategy, global_batch_size=global_batch_size
        ),
        "hand-written": tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(samples)
        .batch(global_batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE),
        "fit NumPy path": fit_adapter.get_tf_dataset(),
    }
    steps = {name: int(dataset.cardinality()) for name, dataset in pipelines.items()}
    # Keras counts the steps of its own array dataset, whose cardinality
    # TensorFlow cannot infer.
    steps["fit NumPy path"] = fit_adapter.num_batches
    print(
        f"{samples} samples x {args.features} features, {strategy.num_replicas_in_sync} "
        f"replicas, global batch {global_batch_size}, {epochs} timed epochs after 1 warm-up"
    )
    rates = {}
    for name, dataset in pipelines.items():
        batches, seconds = _time_epochs(strategy, dataset, steps[name], epochs)
        rates[name] = batches / statistics.median(seconds)
        print(f"  {name:15s} {batches:5d} batches/epoch  {rates[name]:9.1f} batches/sec")
    reference = rates["hand-written"]
    print("ratios to hand-written (above 1 is faster):")
    for name, rate in rates.items():
        print(f"  {name:15s} {rate / reference:5.2f}")


if __name__ == "__main__":
    main()
