"""One argument check everywhere: NumPy numbers accepted, one wording, one behaviour.

A value of the wrong type raises TypeError and a value out of range raises
ValueError; both name the parameter and what was received. Each public entry
point is fed a NumPy integer (accepted, as a Python int would be) and a float
where an integer is due (refused with a TypeError naming the parameter).
"""

import sys

import numpy as np
import pytest

import keras_scaling
from keras_scaling import _validation, data
from keras_scaling.launch import launcher
from keras_scaling.mfu import peak_flops, utilization


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_integers_of_any_kind_are_accepted_as_int(value):
    checked = _validation.positive_int(value, "steps")
    assert checked == 3 and type(checked) is int


@pytest.mark.parametrize("value", [2.5, 3.0, np.float64(3.0), "3", True, np.bool_(True), None])
def test_a_non_integer_is_a_type_error_naming_parameter_and_value(value):
    with pytest.raises(TypeError, match=r"^steps must be a positive integer, got \w+ "):
        _validation.positive_int(value, "steps")


@pytest.mark.parametrize("value", [0, -1, np.int64(0)])
def test_an_integer_out_of_range_is_a_value_error_with_the_fix(value):
    with pytest.raises(ValueError, match=r"^steps must be a positive integer, got .*\. Pass 8\.$"):
        _validation.positive_int(value, "steps", fix="Pass 8.")


def test_zero_is_allowed_where_the_minimum_is_zero():
    assert _validation.non_negative_int(np.int64(0), "retries") == 0
    with pytest.raises(ValueError, match="retries must be an integer >= 0, got -1"):
        _validation.non_negative_int(-1, "retries")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1])
def test_positive_numbers_are_finite_and_above_zero(value):
    with pytest.raises(ValueError, match="rate must be a positive number \\(samples/sec\\)"):
        _validation.positive_number(value, "rate", unit="samples/sec")


def test_a_number_or_a_choice_accepts_both_and_lists_the_choices():
    check = _validation.positive_number_or_one_of
    assert check(np.float32(2.5), "peak", ("auto", None)) == 2.5
    assert check("auto", "peak", ("auto", None)) == "auto"
    with pytest.raises(ValueError, match="peak must be a positive number, 'auto' or None, got 'x'"):
        check("x", "peak", ("auto", None))
    with pytest.raises(TypeError, match="got list"):
        check([1], "peak", ("auto", None))


def test_booleans_accept_numpy_booleans_only_besides_bool():
    assert _validation.boolean(np.bool_(False), "flag") is False
    with pytest.raises(TypeError, match="flag must be True or False, got int 1"):
        _validation.boolean(1, "flag")


# Every public entry point with an integer or number argument, fed NumPy and float.


def test_data_takes_numpy_integers_and_refuses_floats():
    assert data.global_batch_size(np.int64(16)) == 16
    samples = np.zeros((40, 2), "float32")
    plan = data.describe(
        samples, global_batch_size=np.int64(8), num_samples=np.int64(40), seed=np.int64(3)
    )
    assert (plan.global_batch_size, plan.steps_per_epoch) == (8, 5)
    for argument in ("global_batch_size", "per_replica_batch_size", "num_samples"):
        with pytest.raises(TypeError, match=f"{argument} must be a positive integer, got float"):
            data.describe(samples, **{argument: 8.0})


def test_launch_takes_numpy_integers_and_refuses_floats():
    result = launcher.launch(
        [sys.executable, "-c", "pass"],
        num_workers=np.int64(1),
        max_restarts=np.int64(0),
        grace_period_s=np.float32(1.0),
        isolation="off",
    )
    assert result.exit_code == 0
    for argument in ("num_workers", "cpu_devices", "port_base", "max_restarts"):
        kwargs = {"num_workers": 1, argument: 2.0}
        with pytest.raises(TypeError, match=f"{argument} must be"):
            launcher.launch([sys.executable, "-c", "pass"], **kwargs)


def test_worker_env_takes_numpy_integers():
    env = launcher.worker_env({}, [np.int64(2222)], np.int64(0), cpu_devices=np.int64(2))
    assert env["KERAS_SCALING_CPU_DEVICES"] == "2"
    assert "127.0.0.1:2222" in env["TF_CONFIG"]


def test_use_logical_cpus_takes_numpy_integers_and_refuses_floats():
    # This process has one logical CPU already: asking for 1 again is harmless.
    assert len(keras_scaling.use_logical_cpus(np.int64(1))) == 1
    with pytest.raises(TypeError, match="n must be a positive integer, got float"):
        keras_scaling.use_logical_cpus(1.0)


def test_utilization_takes_numpy_numbers_and_refuses_a_float_replica_count():
    figures = utilization.utilization(np.float32(3.2e6), np.int64(10_000), np.int64(2), 1e11)
    assert figures.mfu == pytest.approx(0.16)
    assert utilization.check_peak_flops(np.int64(10**12)) == 1e12
    with pytest.raises(TypeError, match="num_replicas must be a positive integer, got float"):
        utilization.utilization(3.2e6, 1e4, 2.0)


def test_peak_flops_takes_numpy_numbers_as_a_given_peak():
    peak, reason = peak_flops.resolve(
        np.int64(10**12), device_kind="CPU", device="/device:CPU:0", compute_dtype="float32"
    )
    assert (peak.flops_per_sec, peak.source, reason) == (1e12, "given", None)
    with pytest.raises(TypeError, match="repeats must be a positive integer, got float"):
        peak_flops.measure_matmul_flops_per_sec("/device:CPU:0", repeats=2.0)


def test_backup_and_restore_takes_numpy_integers_and_refuses_floats(tmp_path):
    callback = keras_scaling.BackupAndRestore(tmp_path, save_every_n_steps=np.int64(3))
    assert callback.save_every_n_steps == 3 and type(callback.save_every_n_steps) is int
    with pytest.raises(TypeError, match="save_every_n_steps must be a positive integer"):
        keras_scaling.BackupAndRestore(tmp_path, save_every_n_steps=3.0)
