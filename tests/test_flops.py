"""training_flops_per_sample: counts checked against operation counts written out by hand."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_scaling.mfu import flops


def _dense_count(sizes, batch_norm=False):
    """Exact operations of an MLP's training step per sample.

    Forward: a matmul (2 in out) and a bias add (out) per layer. Backward: the
    weight gradient (2 in out) and bias gradient (out) of every layer, and the
    input gradient (2 in out) of every layer but the first, whose input is data.
    """
    total = 0
    for index, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        total += 2 * fan_in * fan_out + fan_out  # forward
        total += 2 * fan_in * fan_out + fan_out  # weight and bias gradients
        if index > 0:
            total += 2 * fan_in * fan_out  # input gradient
    return total


def _compiled(model, loss="mse"):
    model.compile(optimizer="sgd", loss=loss)
    return model


def test_mlp_count_equals_the_exact_operation_count_within_3_percent():
    model = _compiled(
        keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(10),
            ]
        ),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    expected = _dense_count([784, 512, 256, 10])
    counted = flops.training_flops_per_sample(
        model, sample=(np.zeros((16, 784), "float32"), np.zeros((16,), "int32"))
    )
    assert counted == pytest.approx(expected, rel=0.03)


def test_cnn_count_is_within_5_percent_of_the_hand_count():
    model = _compiled(
        keras.Sequential(
            [
                keras.Input((32, 32, 3)),
                keras.layers.Conv2D(32, 3, activation="relu"),  # -> 30x30x32
                keras.layers.MaxPooling2D(),  # -> 15x15x32
                keras.layers.Conv2D(64, 3, activation="relu"),  # -> 13x13x64
                keras.layers.MaxPooling2D(),  # -> 6x6x64
                keras.layers.Flatten(),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
    )
    conv1 = 2 * (30 * 30 * 32) * (3 * 3 * 3)
    conv2 = 2 * (13 * 13 * 64) * (3 * 3 * 32)
    # Forward and filter gradient of both convolutions, input gradient of the
    # second only; the dense layers as in an MLP whose first layer is 2304 wide.
    expected = 2 * conv1 + 3 * conv2 + _dense_count([2304, 128, 10]) + 2 * 2304 * 128
    counted = flops.training_flops_per_sample(model)
    assert counted == pytest.approx(expected, rel=0.05)


def test_training_count_is_forward_plus_both_gradients_not_three_times_forward():
    model = _compiled(
        keras.Sequential(
            [
                keras.Input((100,)),
                keras.layers.Dense(100),
                keras.layers.Dense(100),
            ]
        )
    )
    forward = 2 * (2 * 100 * 100)
    assert flops.training_flops_per_sample(model) / forward == pytest.approx(2.5, rel=0.03)


def test_rnn_returns_none_and_logs_the_loop_as_the_reason(caplog):
    model = _compiled(
        keras.Sequential(
            [
                keras.Input((5, 4)),
                keras.layers.LSTM(8),
                keras.layers.Dense(1),
            ]
        )
    )
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        assert flops.training_flops_per_sample(model) is None
    assert "loop (While ops, as RNN layers do)" in caplog.text


def test_einsum_is_counted_like_the_matmul_it_computes():
    def build(layer):
        return _compiled(keras.Sequential([keras.Input((64,)), layer]))

    dense = build(keras.layers.Dense(32, use_bias=False))
    einsum = build(keras.layers.EinsumDense("ab,bc->ac", output_shape=32))
    assert flops.training_flops_per_sample(einsum) == pytest.approx(
        flops.training_flops_per_sample(dense), rel=0.01
    )


def test_depthwise_convolution_gradients_are_counted():
    model = _compiled(
        keras.Sequential(
            [
                keras.Input((10, 10, 8)),
                keras.layers.Conv2D(
                    8, 1, use_bias=False
                ),  # so the depthwise input needs a gradient
                keras.layers.DepthwiseConv2D(3, use_bias=False),  # -> 8x8x8
                keras.layers.Flatten(),
                keras.layers.Dense(1, use_bias=False),
            ]
        )
    )
    depthwise = 2 * (8 * 8 * 8) * (3 * 3)
    pointwise = 2 * (10 * 10 * 8) * 8
    dense = 2 * 512
    expected = 3 * depthwise + 2 * pointwise + 3 * dense
    assert flops.training_flops_per_sample(model) == pytest.approx(expected, rel=0.05)


def test_unknown_input_shapes_need_a_sample(caplog):
    model = _compiled(keras.Sequential([keras.Input((None, 4)), keras.layers.Dense(3)]))
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        assert flops.training_flops_per_sample(model) is None
    assert "pass sample=(x, y)" in caplog.text


def test_a_sample_fixes_the_shapes_and_the_count_follows_them():
    model = _compiled(keras.Sequential([keras.Input((None, 4)), keras.layers.Dense(3)]))

    def count(length):
        sample = (tf.TensorSpec([2, length, 4]), tf.TensorSpec([2, length, 3]))
        return flops.training_flops_per_sample(model, sample=sample)

    assert count(10) == pytest.approx(2 * count(5), rel=0.01)


def test_count_leaves_weights_and_optimizer_untouched():
    model = _compiled(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    before = [weight.numpy().copy() for weight in model.weights]
    flops.training_flops_per_sample(model)
    assert all(np.array_equal(a, w.numpy()) for a, w in zip(before, model.weights))
    assert int(model.optimizer.iterations.numpy()) == 0


def test_a_model_that_is_not_a_keras_model_is_refused():
    with pytest.raises(TypeError, match="model must be a keras.Model, got str"):
        flops.training_flops_per_sample("mlp")


def _small_mlp():
    return _compiled(
        keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(4),
            ]
        )
    )


def test_without_tensorflows_flop_statistics_nothing_is_counted_and_the_reason_is_named(
    monkeypatch, caplog
):
    from keras_scaling.internals import _probes

    _probes._warned.clear()
    monkeypatch.setenv(_probes.FAIL_PROBES_ENV, "tf.ops.flops_statistics")
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        counted, reason = flops.count_training_flops(_small_mlp())
    assert counted is None
    assert "flops_per_sample=" in reason
    assert any("get_stats_for_node_def" in r.getMessage() for r in caplog.records)
