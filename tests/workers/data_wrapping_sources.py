"""The data people already have, written small and tagged, for the wrapping tests.

Each source is built as a user would build it (Keras' dataset utilities on
files written here, a pipeline ending in `.batch()`, a `PyDataset` with
`workers=2`, a generator function), and every sample carries its id, so
tests can check that each sample is read exactly once per epoch.
`tests/test_data_wrapping.py` uses these on 2 replicas and
`tests/multi_worker/mw_data_wrapping_worker.py` on 2 workers.
"""

import os

import keras
import numpy as np
import tensorflow as tf

NUM_IMAGES = 40
NUM_TEXTS = 40
NUM_SERIES = 60
SEQUENCE_LENGTH = 3
NUM_BATCHED = 50
NUM_PY_ITEMS = 9
PY_ITEM_SIZE = 4
PY_LAST_ITEM_SIZE = 2
NUM_GENERATED = 40
SOURCE_BATCH_SIZE = 4


def write_images(directory):
    """Writes NUM_IMAGES 4x4 grayscale PNGs in two class folders; pixel = id."""
    for index in range(NUM_IMAGES):
        folder = os.path.join(directory, "images", f"class_{index % 2}")
        os.makedirs(folder, exist_ok=True)
        pixels = np.full((4, 4, 1), index, "uint8")
        keras.utils.save_img(os.path.join(folder, f"{index}.png"), pixels, scale=False)


def write_texts(directory):
    """Writes NUM_TEXTS text files in two class folders, each "sample <id>"."""
    for index in range(NUM_TEXTS):
        folder = os.path.join(directory, "texts", f"class_{index % 2}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{index}.txt"), "w") as file:
            file.write(f"sample {index}")


def write_all(directory):
    write_images(directory)
    write_texts(directory)


class TaggedItems(keras.utils.PyDataset):
    """`num_items` batches of ids; counts its epochs as Keras would call them."""

    def __init__(self, num_items=NUM_PY_ITEMS, **kwargs):
        super().__init__(**kwargs)
        self.num_items = num_items
        self.epochs_begun = 0
        self.epochs_ended = 0

    def __len__(self):
        return self.num_items

    def __getitem__(self, index):
        size = PY_LAST_ITEM_SIZE if index == self.num_items - 1 else PY_ITEM_SIZE
        ids = np.arange(index * PY_ITEM_SIZE, index * PY_ITEM_SIZE + size)
        return ids.astype("float32")[:, None], ids.astype("float32")

    def on_epoch_begin(self):
        self.epochs_begun += 1

    def on_epoch_end(self):
        self.epochs_ended += 1


def generate_samples():
    for index in range(NUM_GENERATED):
        yield np.array([index], "float32"), np.float32(index)


GENERATOR_SIGNATURE = (
    tf.TensorSpec([1], tf.float32),
    tf.TensorSpec([], tf.float32),
)


def _text_ids(x):
    return [int(text.split()[1]) for text in x.astype(str)]


# name: (samples in one epoch, the ids of a batch's samples from its (x, y))
SOURCES = {
    "image_dataset_from_directory": (
        NUM_IMAGES,
        lambda x, y: x[:, 0, 0, 0].round().astype(int).tolist(),
    ),
    "text_dataset_from_directory": (NUM_TEXTS, lambda x, y: _text_ids(x)),
    "timeseries_dataset_from_array": (
        NUM_SERIES - SEQUENCE_LENGTH + 1,
        lambda x, y: y.astype(int).tolist(),
    ),
    "batched_pipeline": (NUM_BATCHED, lambda x, y: y.astype(int).tolist()),
    "py_dataset": (
        (NUM_PY_ITEMS - 1) * PY_ITEM_SIZE + PY_LAST_ITEM_SIZE,
        lambda x, y: y.astype(int).tolist(),
    ),
    "generator": (NUM_GENERATED, lambda x, y: y.astype(int).tolist()),
}


def make_source(name, directory):
    """Returns `(data, extra distribute() arguments)` for a source of SOURCES."""
    if name == "image_dataset_from_directory":
        dataset = keras.utils.image_dataset_from_directory(
            os.path.join(directory, "images"),
            image_size=(4, 4),
            color_mode="grayscale",
            batch_size=SOURCE_BATCH_SIZE,
            seed=0,
        )
        return dataset, {}
    if name == "text_dataset_from_directory":
        dataset = keras.utils.text_dataset_from_directory(
            os.path.join(directory, "texts"), batch_size=SOURCE_BATCH_SIZE, seed=0
        )
        return dataset, {}
    if name == "timeseries_dataset_from_array":
        series = np.arange(NUM_SERIES, dtype="float32")
        dataset = keras.utils.timeseries_dataset_from_array(
            series, series, sequence_length=SEQUENCE_LENGTH, batch_size=SOURCE_BATCH_SIZE
        )
        return dataset, {}
    if name == "batched_pipeline":
        ids = tf.data.Dataset.range(NUM_BATCHED)
        samples = ids.map(lambda i: (tf.cast(i, tf.float32)[None], tf.cast(i, tf.float32)))
        return samples.batch(SOURCE_BATCH_SIZE), {}
    if name == "py_dataset":
        return TaggedItems(workers=2), {}
    if name == "generator":
        return generate_samples, {
            "output_signature": GENERATOR_SIGNATURE,
            "num_samples": NUM_GENERATED,
            "per_replica_batch_size": SOURCE_BATCH_SIZE,
        }
    raise KeyError(name)


class CountSteps(keras.callbacks.Callback):
    """Counts the training steps `fit` runs."""

    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1


def for_fit(name, dataset):
    """The dataset as the model takes it: texts become their number.

    Keras cannot build a model on string inputs under a distribution
    strategy (its build adds up the inputs), so text is turned into numbers
    in the pipeline, as a user would with a `TextVectorization` in `.map()`.
    """
    if name != "text_dataset_from_directory":
        return dataset

    def to_number(texts, labels):
        digits = tf.strings.regex_replace(texts, "[^0-9]", "")
        return tf.strings.to_number(digits)[:, None], labels

    return dataset.map(to_number)


def make_model(name):
    """A small regression model for the source's samples."""
    if name == "image_dataset_from_directory":
        inputs = keras.Input((4, 4, 1))
        features = keras.layers.Flatten()(inputs)
    elif name == "timeseries_dataset_from_array":
        inputs = keras.Input((SEQUENCE_LENGTH,))
        features = inputs
    else:
        inputs = keras.Input((1,))
        features = inputs
    model = keras.Model(inputs, keras.layers.Dense(1)(features))
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    return model
