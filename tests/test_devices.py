import json
import subprocess
import sys

import pytest
import tensorflow as tf

import keras_scaling
from keras_scaling import devices


@pytest.mark.logical_cpus(2)
def test_use_logical_cpus_again_with_same_count_is_harmless():
    names = keras_scaling.use_logical_cpus(2)
    assert len(names) == 2


@pytest.mark.logical_cpus(2)
def test_use_logical_cpus_after_initialisation_says_so():
    with pytest.raises(RuntimeError, match="before building models"):
        keras_scaling.use_logical_cpus(3)


@pytest.mark.parametrize("bad", [0, -1])
def test_use_logical_cpus_rejects_non_positive(bad):
    with pytest.raises(ValueError, match="n must be a positive integer, got -?[0-9]"):
        keras_scaling.use_logical_cpus(bad)


@pytest.mark.parametrize("bad", [2.0, "2", True])
def test_use_logical_cpus_rejects_non_integers(bad):
    with pytest.raises(TypeError, match="n must be a positive integer, got (float|str|bool)"):
        keras_scaling.use_logical_cpus(bad)


@pytest.mark.logical_cpus(4)
def test_auto_strategy_mirrors_over_logical_cpus(caplog):
    caplog.set_level("INFO", logger="keras_scaling")
    strategy = keras_scaling.auto_strategy()
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == 4
    assert "4 logical CPUs" in caplog.text


@pytest.mark.logical_cpus(4)
def test_describe_strategy_names_devices_and_counts():
    # Three of the process's four logical CPUs: the strategy's, not the process's.
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    info = keras_scaling.describe_strategy(strategy)
    assert (info.kind, info.num_workers, info.num_replicas) == ("MirroredStrategy", 1, 3)
    assert info.device_kind == "CPU" and info.is_chief and info.worker_index == 0
    assert [name.split(":")[-1] for name in info.local_devices] == ["0", "1", "2"]
    assert str(info).startswith("MirroredStrategy: 1 worker, 3 replicas on CPU")


def test_auto_strategy_on_one_device_is_the_default_strategy():
    strategy = keras_scaling.auto_strategy()
    assert strategy is tf.distribute.get_strategy()
    assert keras_scaling.describe_strategy(strategy).num_replicas == 1


def test_describe_strategy_rejects_non_strategies():
    with pytest.raises(TypeError, match="strategy must be a tf.distribute.Strategy"):
        keras_scaling.describe_strategy("mirrored")


def test_import_does_not_initialise_devices():
    code = "import keras_scaling, keras_scaling.callbacks;print(keras_scaling.use_logical_cpus(3))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("CPU:") == 3


def test_tf_config_rejects_malformed_json(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        devices.tf_config()


def test_tf_config_worker_count_counts_chief_and_workers(monkeypatch):
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {}}))
    from keras_scaling.devices import strategies

    assert strategies._tf_config_worker_count() == 3


def test_read_int_reads_a_step_counter_and_a_tensor_without_a_handle():
    import keras

    from keras_scaling.devices import _topology

    optimizer = keras.optimizers.SGD()
    optimizer.build([keras.Variable(1.0)])
    counter = _topology.local_copy(optimizer.iterations, tf.distribute.get_strategy())
    counter.assign(41)
    counter.assign_add(1)
    assert _topology.read_int(counter) == 42
    assert isinstance(_topology.read_int(counter), int)
    assert _topology.read_int(tf.constant(7, tf.int64)) == 7  # no handle: numpy()
