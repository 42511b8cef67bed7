"""The supported Keras and TensorFlow range, and the warning for keras.distribution."""

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_scaling.internals import _versions


@pytest.mark.parametrize("tensorflow, keras", _versions.TESTED_PAIRS)
def test_every_tested_pair_is_supported(tensorflow, keras):
    assert _versions.unsupported_reason(keras, tensorflow) is None


@pytest.mark.parametrize(
    "keras, tensorflow, named",
    [
        ("3.3.3", "2.16.2", "Keras 3.3.3 is installed"),
        ("3.7.0", "2.18.1", "Keras 3.7.0 is installed"),
        ("2.15.0", "2.15.0", "Keras 2.15.0 is installed"),
        ("3.8.0", "2.17.1", "TensorFlow 2.17.1 is installed"),
        (None, "2.21.0", "Keras is not installed"),
        ("3.15.1", None, "TensorFlow is not installed"),
    ],
)
def test_unsupported_versions_are_named_with_the_supported_range(keras, tensorflow, named):
    reason = _versions.unsupported_reason(keras, tensorflow)

    assert named in reason
    assert "Keras 3.8 or newer" in reason and "TensorFlow 2.18 or newer" in reason


def test_the_installed_versions_are_read_without_importing_them():
    import keras
    import tensorflow as tf

    assert _versions.keras_version() == keras.__version__
    assert _versions.parse(_versions.tf_version())[:2] == _versions.parse(tf.__version__)[:2]


def test_import_refuses_a_keras_below_the_floor(tmp_path):
    # A Keras 3.3.3 package in front of the installed one, as in an old image.
    old_keras = tmp_path / "keras"
    (old_keras / "src").mkdir(parents=True)
    (old_keras / "__init__.py").write_text("__version__ = '3.3.3'\n")
    (old_keras / "src" / "version.py").write_text("__version__ = '3.3.3'\n")
    result = subprocess.run(
        [sys.executable, "-c", "import keras_scaling"],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 1
    assert (
        "ImportError: Keras 3.3.3 is installed. keras_scaling supports Keras 3.8" in result.stderr
    )


@pytest.fixture
def keras_distribution():
    import keras

    from keras_scaling.devices import strategies

    strategies._keras_distribution_warned = False
    try:
        distribution = keras.distribution.DataParallel()
    except AttributeError as error:
        # Keras 3.8's DataParallel fails on the TensorFlow backend when it is
        # created, so no distribution can be set there.
        pytest.skip(f"keras.distribution.DataParallel() fails on this Keras: {error}")
    keras.distribution.set_distribution(distribution)
    yield
    keras.distribution.set_distribution(None)
    strategies._keras_distribution_warned = False


def test_a_keras_distribution_on_tensorflow_is_named_once(keras_distribution, caplog, tmp_path):
    import keras

    import keras_scaling

    strategy = keras_scaling.auto_strategy()
    x = np.zeros((64, 3), "float32")
    train = keras_scaling.data.distribute(
        (x, x[:, :1]), strategy=strategy, per_replica_batch_size=16
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        model.fit(train, verbose=0, callbacks=[keras_scaling.ThroughputLogger(tmp_path)])

    warnings = [r.getMessage() for r in caplog.records if "keras.distribution" in r.getMessage()]
    assert len(warnings) == 1
    assert "set_distribution(DataParallel)" in warnings[0]
    assert "keras_scaling.auto_strategy()" in warnings[0]


def test_no_keras_distribution_no_warning(caplog):
    from keras_scaling import devices

    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        assert devices.warn_if_keras_distribution_set() is False
    assert not caplog.records
