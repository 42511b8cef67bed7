"""distribute's pipeline options: read-ahead and tf.data's thread pools reach the pipeline and change no weight."""

import numpy as np
import pytest

import keras_scaling

pytestmark = pytest.mark.logical_cpus(2)

_FEATURES = 16
_SAMPLES = 512
_OPTIONS = {"prefetch_batches": 3, "private_threadpool_size": 2, "max_intra_op_parallelism": 1}


@pytest.fixture(scope="module")
def strategy():
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _samples():
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.random((_SAMPLES, _FEATURES), dtype="float32")
    # A map, as a decoding step would be: the options' threads run it.
    return tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).map(
        lambda a, b: (a * 1.0, b)
    )


def test_the_thread_pools_reach_the_pipeline_options(strategy):
    train = keras_scaling.data.distribute(
        _samples(), strategy=strategy, per_replica_batch_size=16, **_OPTIONS
    )
    threading = train.options().threading
    assert threading.private_threadpool_size == 2
    assert threading.max_intra_op_parallelism == 1


def test_the_read_ahead_is_the_last_prefetch(strategy):
    import tensorflow as tf

    given = keras_scaling.data.distribute(
        _samples(), strategy=strategy, per_replica_batch_size=16, prefetch_batches=3
    )
    default = keras_scaling.data.distribute(
        _samples(), strategy=strategy, per_replica_batch_size=16
    )
    # The dataset's own buffer size: tf.data has no public accessor for it.
    assert int(given._buffer_size) == 3
    assert int(default._buffer_size) == tf.data.AUTOTUNE


@pytest.mark.parametrize("name", sorted(_OPTIONS))
def test_a_non_positive_option_is_refused_naming_it(strategy, name):
    with pytest.raises(ValueError, match=name):
        keras_scaling.data.distribute(
            _samples(), strategy=strategy, per_replica_batch_size=16, **{name: 0}
        )


def _trained_weights(strategy, weights, **options):
    import keras

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((_FEATURES,)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    model.set_weights(weights)
    train = keras_scaling.data.distribute(
        _samples(), strategy=strategy, per_replica_batch_size=16, shuffle=True, **options
    )
    check = keras_scaling.ReplicaSyncCheck(every_n_steps=8)
    model.fit(train, epochs=2, verbose=0, callbacks=[check])
    return model.get_weights()


def test_the_options_train_bitwise_the_same_weights_with_replicas_equal(strategy):
    import keras

    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((_FEATURES,)), keras.layers.Dense(32), keras.layers.Dense(1)]
        )
    weights = model.get_weights()
    default = _trained_weights(strategy, weights)
    tuned = _trained_weights(strategy, weights, **_OPTIONS)
    assert any(not np.array_equal(a, b) for a, b in zip(weights, default))  # it trained
    for a, b in zip(default, tuned):
        np.testing.assert_array_equal(a, b)
