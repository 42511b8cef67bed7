"""Every all-reduce tune can pick keeps the replicas equal, and `auto_strategy` takes it by name.

Its own module: the strategy here has another all-reduce than those of the
other modules, and MirroredStrategy objects of one process clash.
"""

import numpy as np
import pytest

import keras_scaling
from keras_scaling.tune import _candidates

pytestmark = pytest.mark.logical_cpus(2)


def test_the_all_reduce_tune_tries_on_logical_cpus_keeps_the_replicas_equal():
    import keras

    values, reason = _candidates.all_reduce_values("CPU", 2, 1)
    assert reason is None and values
    for value in values:
        strategy = keras_scaling.auto_strategy(cross_device_ops=value)
        assert type(strategy.extended._cross_device_ops).__name__ == "HierarchicalCopyAllReduce"
        with strategy.scope():
            model = keras.Sequential(
                [keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)]
            )
            model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
        x = np.random.default_rng(0).random((256, 8), dtype="float32")
        train = keras_scaling.data.distribute(
            (x, x.sum(axis=1, keepdims=True)), strategy=strategy, per_replica_batch_size=16
        )
        # Raises ReplicaDivergenceError when a copy of a weight differs.
        check = keras_scaling.ReplicaSyncCheck(every_n_steps=4)
        history = model.fit(train, epochs=2, verbose=0, callbacks=[check])
        assert history.history["loss"][-1] < history.history["loss"][0]


def test_the_all_reduce_named_as_tensorflows_choice_is_the_one_mirrored_strategy_builds():
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    built = strategy.extended._cross_device_ops
    assert type(built).__name__ == "CollectiveAllReduce"
    implementation = built._options.implementation
    assert implementation == tf.distribute.experimental.CommunicationImplementation.RING
    assert _candidates.default_all_reduce("CPU") == "the collective all-reduce (ring)"
    # What tune tries on CPUs is never what TensorFlow picks by itself.
    for value in _candidates.all_reduce_values("CPU", 2, 1)[0]:
        tried = keras_scaling.auto_strategy(cross_device_ops=value).extended._cross_device_ops
        assert type(tried).__name__ != "CollectiveAllReduce"


def test_an_unknown_all_reduce_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="cross_device_ops must be one of hierarchical_copy"):
        keras_scaling.auto_strategy(cross_device_ops="ring")


def test_one_replica_or_several_workers_have_no_all_reduce_to_search():
    assert _candidates.all_reduce_values("CPU", 1, 1) == ((), "one replica: nothing to combine")
    values, reason = _candidates.all_reduce_values("GPU", 2, 2)
    assert values == () and "across workers" in reason
    assert _candidates.all_reduce_values("GPU", 4, 1)[0] == (
        "hierarchical_copy",
        "reduction_to_one_device",
    )


def test_without_its_reach_the_all_reduce_across_workers_is_not_tried_and_says_why(
    monkeypatch, caplog
):
    import logging

    import tensorflow as tf

    from keras_scaling.internals import _communication, _probes

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    options = _communication.communication_options(strategy)
    assert options.bytes_per_pack == 0
    _probes._warned.clear()
    monkeypatch.setenv(_probes.FAIL_PROBES_ENV, "tf.distribute.communication_options")
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        assert _communication.communication_options(strategy) is None
    monkeypatch.delenv(_probes.FAIL_PROBES_ENV)
    _probes._warned.clear()
    probe = _communication.communication_options.probe
    (message,) = [r.getMessage() for r in caplog.records if probe.reaches in r.getMessage()]
    assert probe.lost in message and probe.workaround in message
    context = _candidates.Context(
        device_kind="GPU", local_replicas=1, pipeline_built=True, workers=2
    )
    for knob in _candidates.ACROSS_WORKERS:
        reason = _candidates.reason_not_tried(knob, context)
        assert "auto_strategy(communication=..., bytes_per_pack=...)" in reason


def test_the_options_tune_sets_are_those_the_next_traced_all_reduce_packs_by():
    import copy

    import keras
    import tensorflow as tf
    from traced_packs import traced_packs

    from keras_scaling.internals import _communication

    # MultiWorkerMirroredStrategy reads its options as MirroredStrategy does,
    # at the all-reduce's tracing (tests/multi_worker checks it on 2 workers).
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    start = _communication.communication_options(strategy)
    x = np.random.default_rng(0).random((128, 8), dtype="float32")
    with traced_packs(4) as packs:
        for bytes_per_pack in (0, 41):
            options = copy.deepcopy(start)
            options.bytes_per_pack = bytes_per_pack
            _communication.set_communication_options(strategy, options)
            with strategy.scope():
                model = keras.Sequential(
                    [keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)]
                )
                model.compile(optimizer="sgd", loss="mse")
            model.fit(x, x[:, :1], batch_size=32, epochs=1, verbose=0)
    sizes = [16 * 8 * 4, 16 * 4, 16 * 4, 4]  # the kernels and biases, in bytes
    assert packs == [1, _candidates.pack_count(sizes, 41)] == [1, 3]
