"""`fit` on 2 replicas of MirroredStrategy with bool, string and integer model inputs.

Keras builds the model from the first batch averaged over the replicas, an
`AddN` that has no kernel for bool and string tensors; the `symbolic_build`
fix builds it from one replica's batch. Each model here is deterministic
(seeded or constant initial weights, SGD, batches in order), so 2 replicas
must end with the weights one device gets from the same batches: a model
that saw wrong inputs, or trained on part of them, would not.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_scaling import compat, data

pytestmark = pytest.mark.logical_cpus(2)

NUM_SAMPLES = 48
GLOBAL_BATCH_SIZE = 8
STEPS_PER_EPOCH = NUM_SAMPLES // GLOBAL_BATCH_SIZE  # 6
EPOCHS = 2
WORDS = ["red", "green", "blue", "cyan", "black", "white"]
SEQUENCE_LENGTH = 4

_strategy = []


def mirrored_strategy():
    if not _strategy:
        devices = [device.name for device in tf.config.list_logical_devices("CPU")]
        assert len(devices) == 2
        _strategy.append(tf.distribute.MirroredStrategy(devices))
    return _strategy[0]


def bool_data():
    rng = np.random.default_rng(0)
    flags = rng.random((NUM_SAMPLES, 5)) > 0.5
    y = (flags @ np.arange(1, 6) / 5).astype("float32").reshape(-1, 1)
    return flags, y


def int_data():
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 10, size=(NUM_SAMPLES, 3)).astype("int32")
    y = (ids.sum(axis=1, keepdims=True) / 10).astype("float32")
    return ids, y


def text_data():
    """Raw sentences, one per row (shape `(n, 1)`, as keras.io's text models take them)."""
    rng = np.random.default_rng(2)
    words = rng.choice(WORDS, size=(NUM_SAMPLES, SEQUENCE_LENGTH))
    text = np.array([[" ".join(row)] for row in words])
    y = (words == "red").sum(axis=1, keepdims=True).astype("float32")
    return text, y


def make_bool_model():
    flags = keras.Input((5,), dtype="bool")
    values = keras.layers.Lambda(lambda x: keras.ops.cast(x, "float32"))(flags)
    output = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(0.1))(values)
    return keras.Model(flags, output)


def make_int_model():
    ids = keras.Input((3,), dtype="int32")
    vectors = keras.layers.Embedding(
        10, 4, embeddings_initializer=keras.initializers.RandomNormal(seed=3)
    )(ids)
    output = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(0.1))(
        keras.layers.Flatten()(vectors)
    )
    return keras.Model(ids, output)


def make_text_model():
    """The keras.io shape: `TextVectorization` inside the model, raw strings in."""
    text, _ = text_data()
    vectorize = keras.layers.TextVectorization(
        max_tokens=len(WORDS) + 2, output_sequence_length=SEQUENCE_LENGTH
    )
    vectorize.adapt(text[:, 0])
    sentences = keras.Input((1,), dtype="string")
    vectors = keras.layers.Embedding(
        len(WORDS) + 2, 4, embeddings_initializer=keras.initializers.RandomNormal(seed=4)
    )(vectorize(sentences))
    output = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(0.1))(
        keras.layers.GlobalAveragePooling1D()(vectors)
    )
    return keras.Model(sentences, output)


CASES = {
    "bool": (make_bool_model, bool_data),
    "int": (make_int_model, int_data),
    "string": (make_text_model, text_data),
}


def train(case, strategy):
    make_model, make_data = CASES[case]
    x, y = make_data()
    with strategy.scope():
        model = make_model()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    if strategy.num_replicas_in_sync > 1:
        batches = data.distribute(
            (x, y), strategy=strategy, global_batch_size=GLOBAL_BATCH_SIZE, shuffle=False
        )
        history = model.fit(batches, epochs=EPOCHS, verbose=0)
    else:
        batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH_SIZE)
        history = model.fit(batches, epochs=EPOCHS, verbose=0)
    return model, history.history["loss"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_fit_on_two_replicas_trains_as_one_device_does(case):
    strategy = mirrored_strategy()
    model, losses = train(case, strategy)
    reference, _ = train(case, tf.distribute.get_strategy())

    assert compat.status()["symbolic_build"].active
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * STEPS_PER_EPOCH
    assert all(np.isfinite(losses)) and losses[1] < losses[0]
    for weight, reference_weight in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(weight, reference_weight, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["bool", "string"])
def test_keras_still_needs_the_symbolic_build_fix_for_bool_and_string_inputs(case):
    strategy = mirrored_strategy()
    compat.disable("symbolic_build")
    try:
        train(case, strategy)
    except tf.errors.InvalidArgumentError as error:
        assert f"Value for attr 'T' of {case} is not in the list of allowed values" in str(error)
    else:
        pytest.fail(
            f"Keras {keras.__version__} now builds a model with {case} inputs on 2 "
            "replicas without keras_scaling's fix: drop bool and string inputs "
            "from the symbolic_build fix's reasons"
        )
    finally:
        compat.enable()
    # The failed call leaves the strategy usable for the next fit.
    _, losses = train(case, strategy)
    assert np.isfinite(losses).all()
