"""Wrapped data: distribute() around the datasets users have, against using them as they are.

Two sources, each read three ways under the same strategy:

- PNG files through `keras.utils.image_dataset_from_directory(batch_size=B)`:
  `as-is` (the dataset given to `fit` directly: B is then the global
  batch), `unbatch-batch` (the hand-written fix, `.unbatch().batch(B * R)`)
  and `distribute` (`keras_scaling.data.distribute(dataset)`: B per replica,
  files split before decoding, seeded shuffle).
- A `keras.utils.PyDataset` of B-sample items with `workers=2`: `Keras
  adapter` (the `tf.data.Dataset` Keras' own adapter builds for
  `fit(py_dataset)`), and `distribute`.

Each pipeline is iterated the way Keras iterates it under the strategy
(`benchmarks/input_pipeline.py`'s `_time_epochs`: a `tf.function` step per
batch with a trivial computation, a new iterator each epoch, one warm-up
epoch). The pipelines of a source alternate, round after round, so that
machine noise falls on all of them alike; the median and the spread (min to
max over rounds) of samples per second are printed, and the ratio of medians
to the first pipeline of the source (above 1 is faster).

Usage:

    python benchmarks/wrapped_data.py [--quick] [--replicas 2]
"""

import argparse
import os
import statistics
import tempfile

import keras_scaling


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer files and rounds")
    parser.add_argument("--replicas", type=int, default=2, help="logical CPU replicas")
    parser.add_argument("--batch-size", type=int, default=32, help="the data's own batch")
    parser.add_argument("--rounds", type=int, default=None)
    return parser.parse_args()


def _write_images(directory, count):
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    for index in range(count):
        folder = os.path.join(directory, f"class_{index % 4}")
        os.makedirs(folder, exist_ok=True)
        pixels = rng.integers(0, 256, size=(64, 64, 3), dtype="uint8")
        keras.utils.save_img(os.path.join(folder, f"{index}.png"), pixels, scale=False)


def _py_dataset(num_items, batch_size):
    import keras
    import numpy as np

    class Items(keras.utils.PyDataset):
        def __len__(self):
            return num_items

        def __getitem__(self, index):
            rng = np.random.default_rng(index)
            return rng.normal(size=(batch_size, 256)).astype("float32"), np.zeros(batch_size)

    return Items(workers=2)


def _compare(strategy, pipelines, rounds):
    """Alternates the pipelines for `rounds` rounds; prints samples/sec."""
    from input_pipeline import _time_epochs

    rates = {name: [] for name in pipelines}
    for _ in range(rounds):
        for name, (dataset, steps, samples_per_batch) in pipelines.items():
            batches, seconds = _time_epochs(strategy, dataset, steps, epochs=1)
            rates[name].append(batches * samples_per_batch / seconds[0])
    reference = statistics.median(next(iter(rates.values())))
    for name, values in rates.items():
        median = statistics.median(values)
        print(
            f"  {name:15s} {median:9.0f} samples/sec (spread {min(values):.0f}-"
            f"{max(values):.0f})  ratio {median / reference:5.2f}"
        )


def main():
    args = _parse_args()
    keras_scaling.use_logical_cpus(args.replicas)
    import keras

    from keras_scaling import data

    strategy = keras_scaling.auto_strategy()
    replicas = strategy.num_replicas_in_sync
    batch = args.batch_size
    rounds = args.rounds or (3 if args.quick else 7)
    num_images = 640 if args.quick else 3200

    with tempfile.TemporaryDirectory() as directory:
        _write_images(directory, num_images)
        images = keras.utils.image_dataset_from_directory(
            directory, image_size=(64, 64), batch_size=batch, seed=0
        )
        wrapped = data.distribute(images, strategy=strategy)
        global_batch = data.plan_of(wrapped).global_batch_size
        print(
            f"{num_images} PNG files 64x64, {replicas} replicas, data batch {batch}, "
            f"{rounds} alternating rounds"
        )
        _compare(
            strategy,
            {
                "as-is": (images, num_images // batch, batch),
                "unbatch-batch": (
                    images.unbatch().batch(global_batch, drop_remainder=True),
                    num_images // global_batch,
                    global_batch,
                ),
                "distribute": (wrapped, data.plan_of(wrapped).steps_per_epoch, global_batch),
            },
            rounds,
        )

    from keras.src.trainers.data_adapters import get_data_adapter

    num_items = 100 if args.quick else 400
    items = _py_dataset(num_items, batch)
    adapter = get_data_adapter(items)
    wrapped = data.distribute(items, strategy=strategy)
    global_batch = data.plan_of(wrapped).global_batch_size
    print(f"PyDataset of {num_items} items of {batch} x 256, workers=2")
    _compare(
        strategy,
        {
            "Keras adapter": (adapter.get_tf_dataset(), num_items, batch),
            "distribute": (wrapped, data.plan_of(wrapped).steps_per_epoch, global_batch),
        },
        rounds,
    )


if __name__ == "__main__":
    main()
