"""Failed probes on 2 replicas: training goes on, one warning, nothing guessed.

Each test makes some probes fail as if a Keras or TensorFlow release had
moved the private name they read (`KERAS_SCALING_FAIL_PROBES`), runs a real
`fit` with the piece that needs them, and compares with the same run where
every probe works. `test_probes.py` checks that every probe is covered.
"""

import importlib.util
import os

import pytest
import tensorflow as tf

from keras_scaling import compat
from keras_scaling.internals import _probes, _versions

pytestmark = pytest.mark.logical_cpus(2)

_spec = importlib.util.spec_from_file_location(
    "probe_scenario", os.path.join(os.path.dirname(__file__), "workers", "probe_scenario.py")
)
scenarios = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scenarios)


@pytest.fixture(scope="module")
def strategy():
    devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    mirrored = tf.distribute.MirroredStrategy(devices)
    compat.enable_for(mirrored)
    return mirrored


def run(scenario, strategy, out_dir, monkeypatch, failing=()):
    """Runs a scenario with `failing` probes; returns its report and warnings."""
    _probes._warned.clear()
    compat._probe_results.clear()
    if failing:
        monkeypatch.setenv(_probes.FAIL_PROBES_ENV, ",".join(failing))
    try:
        with scenarios.WarningCollector() as collector:
            if scenario is scenarios.compat_fit:
                compat.disable()
                compat.enable()
            report = scenario(strategy, str(out_dir))
    finally:
        monkeypatch.delenv(_probes.FAIL_PROBES_ENV, raising=False)
        _probes._warned.clear()
        compat._probe_results.clear()
        compat.disable()
        compat.enable()
    return report, collector.messages


def assert_warned_once(messages, name):
    probe = _probes._registry[name]
    found = [m for m in messages if probe.reaches in m and probe.lost in m and "is not usable" in m]
    assert len(found) == 1, (name, messages)
    assert f"Keras {_versions.keras_version()}" in found[0]
    assert probe.workaround in found[0]


def test_throughput_of_unknown_batches_is_left_out_not_guessed(strategy, tmp_path, monkeypatch):
    failing = ("tf.distribute.iterator_dataset",)
    report, messages = run(scenarios.throughput, strategy, tmp_path, monkeypatch, failing)

    assert report["trained"]
    for name in failing:
        assert_warned_once(messages, name)
    # Arrays whose last batch is partial: the batch is unknown without global_batch_size=.
    assert report["arrays_global_batch_size"] is None
    assert report["arrays_samples_per_sec"] is None
    assert any("measures nothing in this fit" in m for m in messages)
    # Static batch shapes still give the global batch: 2 replicas x 16.
    assert report["dataset_global_batch_size"] == 32
    assert report["dataset_samples_per_sec"] > 0


def test_throughput_without_the_dataset_walk_uses_static_shapes(strategy, tmp_path, monkeypatch):
    # Both reach Dataset._inputs(): the plan behind fit's data, and the batching behind it.
    failing = ("tf.data.dataset_inputs", "tf.data.batching_transformation")
    report, messages = run(scenarios.throughput, strategy, tmp_path, monkeypatch, failing)

    assert report["trained"]
    for name in failing:
        assert_warned_once(messages, name)
    assert report["dataset_global_batch_size"] == 32
    assert report["arrays_global_batch_size"] is None


def test_the_input_timing_and_replica_spec_degrade_to_unknown(strategy, monkeypatch):
    from keras_scaling.internals import _tf_data

    dataset = tf.data.Dataset.range(8).batch(2)
    spec = strategy.experimental_distribute_dataset(dataset).element_spec
    healthy_ops = _tf_data.op_types(dataset)
    healthy_spec = _tf_data.first_replica_spec(spec)
    _probes._warned.clear()
    monkeypatch.setenv(
        _probes.FAIL_PROBES_ENV, "tf.data.serialized_graph,tf.distribute.per_replica_spec"
    )
    with scenarios.WarningCollector() as collector:
        ops = _tf_data.op_types(dataset)
        one_spec = _tf_data.first_replica_spec(spec)

    assert "BatchDatasetV2" in healthy_ops and ops is None
    assert healthy_spec.shape.as_list() == [None] and one_spec is spec
    assert_warned_once(collector.messages, "tf.data.serialized_graph")
    assert_warned_once(collector.messages, "tf.distribute.per_replica_spec")


def test_replica_sync_falls_back_to_public_names_with_the_same_roles(
    strategy, tmp_path, monkeypatch
):
    failing = (
        "keras.layer.flatten_layers",
        "keras.layer.seed_generators",
        "keras.optimizer.accumulated_gradients",
    )
    healthy, healthy_messages = run(scenarios.replica_sync, strategy, tmp_path / "a", monkeypatch)
    degraded, messages = run(scenarios.replica_sync, strategy, tmp_path / "b", monkeypatch, failing)

    assert not any("is not usable" in m for m in healthy_messages)
    for name in failing:
        assert_warned_once(messages, name)
    assert degraded["trained"] and degraded["report_ok"]
    # Public layers, variable names and optimizer counters give the same roles.
    assert degraded["roles"] == healthy["roles"]
    assert degraded["accumulator_roles"] == healthy["accumulator_roles"]
    assert "gradient accumulator" in healthy["accumulator_roles"]


TRAINER_FIXES = ("steps_per_execution", "symbolic_build", "scalar_reduce", "multi_worker_epoch")
ALL_FIXES = (*TRAINER_FIXES, "loss_scale_finite")


@pytest.mark.parametrize(
    "failing, fixes_off",
    [
        # loss_scale_finite replaces a method of the public LossScaleOptimizer.
        (("keras.trainer_module",), TRAINER_FIXES),
        # The other two fixes replace functions of the module, not the class.
        (("keras.trainer_class",), ("steps_per_execution", "symbolic_build")),
        (tuple(f"compat.{fix}" for fix in ALL_FIXES), ALL_FIXES),
    ],
    ids=["trainer-module", "trainer-class", "fix-probes"],
)
def test_compat_without_the_trainer_turns_its_fixes_off(
    strategy, tmp_path, monkeypatch, failing, fixes_off
):
    report, messages = run(scenarios.compat_fit, strategy, tmp_path, monkeypatch, failing)

    assert report["trained"] and report["replicas"] == 2
    for fix in ALL_FIXES:
        assert report["needed"][fix] is (fix not in fixes_off), fix
        assert (fix in report["active"]) is (fix not in fixes_off), fix
    for name in failing:
        assert_warned_once(messages, name)


def test_compat_without_the_dataset_adapter_keeps_the_other_fixes(strategy, tmp_path, monkeypatch):
    report, messages = run(
        scenarios.compat_fit, strategy, tmp_path, monkeypatch, ("keras.tf_dataset_adapter",)
    )

    assert report["trained"]
    assert report["needed"]["multi_worker_epoch"] is False
    assert report["needed"]["steps_per_execution"] is True
    assert "steps_per_execution" in report["active"]
    assert_warned_once(messages, "keras.tf_dataset_adapter")
