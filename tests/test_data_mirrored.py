"""distribute() under a real MirroredStrategy of 2, 3 and 4 replicas.

The 3-replica strategies use 3 of the 4 logical CPUs of the process that
runs the tests marked logical_cpus(4).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_scaling import data

NUM_EXAMPLES = 1001  # divides by none of the global batches below


def _mirrored(num_replicas):
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(num_replicas)])


def _replica_batches(strategy, dataset):
    """Per step, the list of each replica's components, as Keras receives them."""
    steps = []
    for batch in strategy.experimental_distribute_dataset(dataset):
        parts = batch if isinstance(batch, tuple) else (batch,)
        per_component = [strategy.experimental_local_results(part) for part in parts]
        steps.append(
            [
                tuple(component[replica].numpy() for component in per_component)
                for replica in range(strategy.num_replicas_in_sync)
            ]
        )
    return steps


def _real_ids(steps):
    """Ids of the samples seen, leaving out rows whose sample weight is 0."""
    ids = []
    for replicas in steps:
        for parts in replicas:
            if len(parts) == 3:
                ids.extend(parts[0][parts[2] > 0].tolist())
            else:
                ids.extend(parts[0].tolist())
    return ids


def _check_coverage(num_replicas, last_batch, per_replica_batch_size=16):
    strategy = _mirrored(num_replicas)
    ids = np.arange(NUM_EXAMPLES)
    dataset = data.distribute(
        (ids, ids),
        strategy=strategy,
        per_replica_batch_size=per_replica_batch_size,
        last_batch=last_batch,
    )
    plan = data.plan_of(dataset)
    steps = _replica_batches(strategy, dataset)
    seen = _real_ids(steps)
    assert len(steps) == plan.steps_per_epoch
    assert len(seen) == len(set(seen)), "a sample was read twice"
    assert len(seen) == NUM_EXAMPLES - plan.samples_dropped_per_epoch
    if last_batch != "drop":
        assert sorted(seen) == list(range(NUM_EXAMPLES))
    return plan, steps


@pytest.mark.logical_cpus(2)
@pytest.mark.parametrize("last_batch", ["drop", "pad", "partial"])
def test_every_sample_once_on_2_replicas(last_batch):
    _check_coverage(2, last_batch)


@pytest.mark.logical_cpus(4)
@pytest.mark.parametrize("last_batch", ["drop", "pad", "partial"])
def test_every_sample_once_on_4_replicas(last_batch):
    _check_coverage(4, last_batch)


@pytest.mark.logical_cpus(4)
def test_drop_gives_every_replica_a_full_static_batch():
    plan, steps = _check_coverage(3, "drop", per_replica_batch_size=32)
    assert (plan.steps_per_epoch, plan.samples_dropped_per_epoch) == (10, 41)
    assert {parts[0].shape for replicas in steps for parts in replicas} == {(32,)}


@pytest.mark.logical_cpus(4)
def test_drop_declares_static_shapes():
    dataset = data.distribute(
        (np.zeros((100, 5)), np.zeros(100)), strategy=_mirrored(3), per_replica_batch_size=8
    )
    assert [spec.shape.as_list() for spec in dataset.element_spec] == [[24, 5], [24]]


@pytest.mark.logical_cpus(4)
def test_pad_fills_the_last_batch_with_zero_weight_rows():
    plan, steps = _check_coverage(3, "pad", per_replica_batch_size=32)
    assert (plan.steps_per_epoch, plan.samples_padded_per_epoch) == (11, 55)
    weights = np.concatenate([parts[2] for replicas in steps for parts in replicas])
    assert weights.shape == (11 * 96,)
    assert (weights == 0).sum() == 55 and (weights == 1).sum() == NUM_EXAMPLES
    assert {parts[0].shape for replicas in steps for parts in replicas} == {(32,)}


@pytest.mark.logical_cpus(4)
def test_partial_keeps_the_smaller_last_batch():
    plan, steps = _check_coverage(3, "partial", per_replica_batch_size=32)
    assert plan.steps_per_epoch == 11
    assert sum(len(parts[0]) for parts in steps[-1]) == 41


def _linear_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.layers[0].set_weights([np.ones((4, 1), "float32"), np.zeros(1, "float32")])
    model.compile(optimizer="sgd", loss="mse", weighted_metrics=["mse"])
    return model


@pytest.mark.logical_cpus(4)
def test_evaluate_on_padded_data_counts_every_sample_once():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, 4)).astype("float32")
    y = rng.normal(size=(NUM_EXAMPLES, 1)).astype("float32")
    true_mse = float(np.mean((x.sum(axis=1, keepdims=True) - y) ** 2))
    strategy = _mirrored(3)
    dataset = data.distribute(
        (x, y), strategy=strategy, per_replica_batch_size=32, last_batch="pad", shuffle=False
    )
    plan = data.plan_of(dataset)
    with strategy.scope():
        model = _linear_model()
    results = model.evaluate(dataset, return_dict=True, verbose=0)
    assert results["mse"] == pytest.approx(true_mse, rel=1e-5)
    # Keras divides its loss by every row, padding included.
    padded_rows = NUM_EXAMPLES + plan.samples_padded_per_epoch
    assert results["loss"] == pytest.approx(true_mse * NUM_EXAMPLES / padded_rows, rel=1e-5)


@pytest.mark.logical_cpus(4)
def test_fit_evaluate_and_predict_run_under_the_strategy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    strategy = _mirrored(3)
    with strategy.scope():
        model = _linear_model()
    train = data.distribute((x, y), strategy=strategy, per_replica_batch_size=16)
    history = model.fit(train, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    evaluation = data.distribute(
        (x, y), strategy=strategy, per_replica_batch_size=16, shuffle=False, last_batch="pad"
    )
    assert np.isfinite(model.evaluate(evaluation, verbose=0)[0])
    inputs = data.distribute(
        x, strategy=strategy, per_replica_batch_size=16, shuffle=False, last_batch="pad"
    )
    predictions = model.predict(inputs, verbose=0)
    plan = data.plan_of(inputs)
    assert predictions.shape == (300 + plan.samples_padded_per_epoch, 1)
    np.testing.assert_allclose(predictions[:300], model(x).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.logical_cpus(4)
def test_same_seed_same_order_and_new_order_each_epoch():
    strategy = _mirrored(3)
    ids = np.arange(300)

    def epoch_orders(seed, epochs=2):
        dataset = data.distribute(ids, strategy=strategy, per_replica_batch_size=10, seed=seed)
        distributed = strategy.experimental_distribute_dataset(dataset)
        orders = []
        for _ in range(epochs):
            orders.append(
                [
                    value
                    for batch in distributed
                    for part in strategy.experimental_local_results(batch)
                    for value in part.numpy().tolist()
                ]
            )
        return orders

    first, second = epoch_orders(seed=7)
    assert sorted(first) == sorted(second) == list(range(300))
    assert first != second, "every epoch must have a new order"
    assert epoch_orders(seed=7) == [first, second]
    assert epoch_orders(seed=8)[0] != first


@pytest.mark.logical_cpus(4)
def test_per_replica_batch_is_derived_from_the_global_batch():
    plan = data.describe(np.arange(99), strategy=_mirrored(3), global_batch_size=33)
    assert (plan.per_replica_batch_size, plan.num_replicas, plan.steps_per_epoch) == (11, 3, 3)
    assert data.global_batch_size(11, _mirrored(3)) == 33


@pytest.mark.logical_cpus(4)
def test_global_batch_not_divisible_by_the_replicas_is_refused():
    with pytest.raises(
        ValueError, match="global_batch_size=100 is not divisible by the 3 replicas"
    ):
        data.distribute(np.arange(200), strategy=_mirrored(3), global_batch_size=100)


@pytest.mark.logical_cpus(4)
def test_the_strategy_defaults_to_the_one_in_scope():
    strategy = _mirrored(3)
    with strategy.scope():
        plan = data.plan_of(data.distribute(np.arange(60), per_replica_batch_size=4))
    assert (plan.num_replicas, plan.global_batch_size, plan.strategy) == (3, 12, "MirroredStrategy")
