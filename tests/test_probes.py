"""Every reach into a private Keras or TensorFlow name has a test of its failure.

Each probe is made to fail as if a release had moved the name it reads (with
`KERAS_SCALING_FAIL_PROBES`, since most of these names are used by Keras and
TensorFlow themselves and cannot be hidden without breaking them). A real
`fit` then still trains, one warning names the Keras version, what is lost
and the workaround, and no figure is guessed. The single-machine pieces are
tested in `test_probes_mirrored.py`; the multi-worker device hook here,
since `TF_CONFIG` must be set before TensorFlow starts.
"""

import json
import logging
import os
import subprocess
import sys

from keras_scaling.internals import _probes, _versions
from keras_scaling.launch import launcher

_WORKER = os.path.join(os.path.dirname(__file__), "workers", "probe_scenario.py")
_TIMEOUT_S = 180

# Every probe, and the test module that makes it fail.
PROBES_TESTED_IN = {
    "tf.distribute.iterator_dataset": "test_probes_mirrored",  # and callbacks/test_backup_and_restore
    "tf.data.dataset_inputs": "test_probes_mirrored",
    "tf.distribute.per_replica_spec": "test_probes_mirrored",
    "tf.data.serialized_graph": "test_probes_mirrored",
    "keras.layer.flatten_layers": "test_probes_mirrored",
    "keras.layer.seed_generators": "test_probes_mirrored",
    "keras.optimizer.accumulated_gradients": "test_probes_mirrored",
    "keras.optimizer.batch_counter": "callbacks/test_step_counter",
    "keras.trainer_module": "test_probes_mirrored",
    "keras.trainer_class": "test_probes_mirrored",
    "keras.tf_dataset_adapter": "test_probes_mirrored",
    "compat.steps_per_execution": "test_probes_mirrored",
    "compat.symbolic_build": "test_probes_mirrored",
    "compat.scalar_reduce": "test_probes_mirrored",
    "compat.multi_worker_epoch": "test_probes_mirrored",
    "compat.loss_scale_finite": "test_probes_mirrored",
    "tf.collective_local_devices": "test_probes",
    "tf.data.batching_transformation": "test_probes",
    "tf.data.batch_node": "test_probes",
    "tf.data.directory_pipeline": "test_data_wrapping",
    "tf.ops.flops_statistics": "test_flops",
    "keras.epoch_iterator_passes": "test_data_pass_order_multi_worker",
    "keras.epoch_loop_errors": "callbacks/test_throughput_logger",
    "tf.coordination_key_value_store": "cli/test_doctor",
    "tf.distribute.communication_options": "tune/test_tune_all_reduce",
}


def registered_probes():
    """Every probe of the package: importing every module registers them."""
    import keras_scaling.compat  # noqa: F401
    import keras_scaling.data  # noqa: F401
    import keras_scaling.devices.strategies  # noqa: F401
    import keras_scaling.doctor._collectives  # noqa: F401
    import keras_scaling.fit_hooks._fit_end  # noqa: F401
    import keras_scaling.internals._communication  # noqa: F401
    import keras_scaling.mfu.flops  # noqa: F401
    import keras_scaling.preemption.backup_and_restore  # noqa: F401
    import keras_scaling.replica_sync.replica_state  # noqa: F401
    import keras_scaling.replica_sync.replica_sync_check  # noqa: F401
    import keras_scaling.throughput.baseline  # noqa: F401
    import keras_scaling.throughput.throughput_logger  # noqa: F401

    return dict(_probes._registry)


def test_every_probe_has_a_failure_test():
    assert set(registered_probes()) == set(PROBES_TESTED_IN)


def run_one_worker(out_dir, failing=()):
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in (_probes.FAIL_PROBES_ENV, "KERAS_SCALING_NO_COMPAT")
    }
    env = launcher.worker_env(env, launcher.free_ports(1), 0)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if failing:
        env[_probes.FAIL_PROBES_ENV] = ",".join(failing)
    result = subprocess.run(
        [sys.executable, _WORKER, str(out_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_multi_worker_without_the_device_hook_trains_on_one_replica(tmp_path):
    probe = registered_probes()["tf.collective_local_devices"]

    degraded = run_one_worker(tmp_path / "degraded", failing=[probe.name])
    healthy = run_one_worker(tmp_path / "healthy")

    assert healthy == {"trained": True, "replicas": 2, "warnings": []}
    assert degraded["trained"] and degraded["replicas"] == 1
    (warning,) = degraded["warnings"]
    assert f"Keras {_versions.keras_version()}" in warning
    assert probe.reaches in warning and probe.lost in warning and probe.workaround in warning


def probe_warnings(caplog, name):
    probe = _probes._registry[name]
    return [
        record.getMessage()
        for record in caplog.records
        if probe.reaches in record.getMessage()
        and probe.lost in record.getMessage()
        and f"Keras {_versions.keras_version()}" in record.getMessage()
    ]


def describe_with_failing(name, dataset, monkeypatch, caplog, **kwargs):
    """The plan of `dataset` with the probe `name` failing; and its warnings."""
    from keras_scaling import data

    _probes._warned.clear()
    monkeypatch.setenv(_probes.FAIL_PROBES_ENV, name)
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        plan = data.describe(dataset, **kwargs)
        data.describe(dataset, **kwargs)  # a second dataset: no second warning
    monkeypatch.delenv(_probes.FAIL_PROBES_ENV)
    _probes._warned.clear()
    return plan, probe_warnings(caplog, name)


def test_without_the_dataset_walk_a_batched_dataset_is_taken_as_samples(monkeypatch, caplog):
    import tensorflow as tf

    from keras_scaling import data

    batched = tf.data.Dataset.range(50).batch(8)
    assert data.describe(batched, per_replica_batch_size=5).num_examples == 50

    plan, warnings = describe_with_failing(
        "tf.data.batching_transformation",
        batched,
        monkeypatch,
        caplog,
        per_replica_batch_size=5,
    )

    assert plan.num_examples == 7  # its 7 batches, read as samples
    assert len(warnings) == 1


def test_without_the_batch_node_the_samples_are_counted_from_the_data(monkeypatch, caplog):
    import tensorflow as tf

    from keras_scaling import data

    batched = tf.data.Dataset.range(50).map(lambda i: (i, i)).batch(8).prefetch(2)
    healthy = data.describe(batched)
    assert any("50 elements before .batch()" in note for note in healthy.notes)

    plan, warnings = describe_with_failing("tf.data.batch_node", batched, monkeypatch, caplog)

    assert (plan.num_examples, plan.per_replica_batch_size) == (50, 8)
    assert any("counted by reading the data once" in note for note in plan.notes)
    assert len(warnings) == 1


def _guarded_for_test(name, body):
    return _probes.guarded(
        name, reaches=f"{name} reach", lost=f"{name} lost", workaround="none", fallback="fallback"
    )(body)


def test_a_guard_turns_a_missing_internal_into_its_fallback_with_a_warning(caplog):
    def reach():
        return object()._keras_private_name

    guarded = _guarded_for_test("test.missing_internal", reach)
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        assert guarded() == "fallback"
    assert any("test.missing_internal reach" in r.getMessage() for r in caplog.records)


def test_a_guard_lets_a_logic_error_propagate_without_a_warning(caplog):
    import pytest

    def body():
        return 1 / 0

    guarded = _guarded_for_test("test.logic_error", body)
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        with pytest.raises(ZeroDivisionError):
            guarded()
    assert not any("test.logic_error" in r.getMessage() for r in caplog.records)


def test_a_bug_around_the_batch_node_reach_surfaces_instead_of_keras_changed(caplog):
    import pytest
    import tensorflow as tf

    from keras_scaling.internals import _tf_data_batching

    source = tf.data.Dataset.range(50)
    # A deliberate bug in what the walk does with the node it read.
    source.cardinality = lambda: 1 // 0
    batched = source.batch(8)
    _probes._warned.clear()
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        with pytest.raises(ZeroDivisionError):
            _tf_data_batching.batch_node(batched)
    assert probe_warnings(caplog, "tf.data.batch_node") == []
    assert "tf.data.batch_node" not in _probes._warned
