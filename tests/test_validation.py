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


@pytest.mark.parametrize("value, checked", [(None, None), (np.bool_(True), True), (False, False)])
def test_an_optional_boolean_is_none_or_a_bool_of_either_kind(value, checked):
    assert _validation.optional_boolean(value, "shuffle") is checked


@pytest.mark.parametrize("value, checked", [(None, None), (np.int32(-3), -3), (0, 0)])
def test_an_optional_integer_is_none_or_an_integer_of_any_sign(value, checked):
    result = _validation.optional_integer(value, "seed")
    assert result == checked and type(result) is type(checked)


def test_optional_booleans_and_integers_refuse_other_types_naming_parameter_and_value():
    with pytest.raises(TypeError, match="^shuffle must be True, False or None, got str 'yes'$"):
        _validation.optional_boolean("yes", "shuffle")
    with pytest.raises(TypeError, match="^seed must be an integer or None, got bool True$"):
        _validation.optional_integer(True, "seed")


# Every public entry point with an integer or number argument, once: fed NumPy
# numbers, each takes them as the Python numbers they are (the values it keeps
# or returns are Python ints and floats); fed a float where an integer is due,
# each raises one TypeError naming the parameter.


def _doctor_checks(size_mb, rounds):
    import tensorflow as tf

    from keras_scaling.doctor import run_checks

    return run_checks(tf.distribute.get_strategy(), size_mb=size_mb, rounds=rounds)


def _itself(value):
    return value


# (a call with NumPy numbers, what is read back from its result, the Python values expected)
NUMPY_NUMBERS_TAKEN = [
    pytest.param(
        lambda _: data.global_batch_size(np.int64(16)), _itself, 16, id="data.global_batch_size"
    ),
    pytest.param(
        lambda _: data.describe(
            np.zeros((40, 2), "float32"),
            global_batch_size=np.int64(8),
            num_samples=np.int64(40),
            seed=np.int32(3),
            shuffle=np.bool_(True),
        ),
        lambda plan: (plan.global_batch_size, plan.steps_per_epoch, plan.seed),
        (8, 5, 3),
        id="data.describe",
    ),
    pytest.param(
        lambda _: launcher.launch(
            [sys.executable, "-c", "pass"],
            num_workers=np.int64(1),
            max_restarts=np.int64(0),
            grace_period_s=np.float32(1.0),
            isolation="off",
        ),
        lambda result: result.exit_code,
        0,
        id="launcher.launch",
    ),
    pytest.param(
        lambda _: launcher.worker_env({}, [np.int64(2222)], np.int64(0), cpu_devices=np.int64(2)),
        lambda env: (env["KERAS_SCALING_CPU_DEVICES"], "127.0.0.1:2222" in env["TF_CONFIG"]),
        ("2", True),
        id="launcher.worker_env",
    ),
    # This process has one logical CPU already: asking for 1 again is harmless.
    pytest.param(
        lambda _: keras_scaling.use_logical_cpus(np.int64(1)), len, 1, id="use_logical_cpus"
    ),
    pytest.param(
        lambda _: utilization.utilization(np.float32(3.2e6), np.int64(10_000), np.int64(2), 1e11),
        lambda figures: round(figures.mfu, 12),
        0.16,
        id="utilization.utilization",
    ),
    pytest.param(
        lambda _: utilization.check_peak_flops(np.int64(10**12)),
        _itself,
        1e12,
        id="utilization.check_peak_flops",
    ),
    pytest.param(
        lambda _: peak_flops.resolve(
            np.int64(10**12), device_kind="CPU", device="/device:CPU:0", compute_dtype="float32"
        ),
        lambda resolved: (resolved[0].flops_per_sec, resolved[0].source, resolved[1]),
        (1e12, "given", None),
        id="peak_flops.resolve",
    ),
    pytest.param(
        lambda _: keras_scaling.throughput.speedup(
            np.float32(1800.0), np.float64(1000.0), num_replicas=np.int64(2)
        ),
        lambda figures: (figures.speedup, figures.ideal_speedup),
        (1.8, 2.0),
        id="throughput.speedup",
    ),
    pytest.param(
        lambda _: keras_scaling.ReplicaSyncCheck(
            np.int64(5), atol=np.float32(0.5), rtol=np.int32(0)
        ),
        lambda check: (check.every_n_steps, check.atol, check.rtol),
        (5, 0.5, 0.0),
        id="ReplicaSyncCheck",
    ),
    pytest.param(
        lambda tmp_path: keras_scaling.ThroughputLogger(
            tmp_path,
            global_batch_size=np.int64(32),
            update_freq=np.int32(4),
            warmup_steps=np.int64(0),
            baseline=np.float64(100.0),
        ),
        lambda logger: (logger.global_batch_size, logger.update_freq, logger.warmup_steps),
        (32, 4, 0),
        id="ThroughputLogger",
    ),
    pytest.param(
        lambda tmp_path: keras_scaling.BackupAndRestore(tmp_path, save_every_n_steps=np.int64(3)),
        lambda callback: callback.save_every_n_steps,
        3,
        id="BackupAndRestore",
    ),
    pytest.param(
        lambda _: _doctor_checks(size_mb=np.float32(0.001), rounds=np.int64(1)),
        lambda report: report.ok,
        True,
        id="doctor.run_checks",
    ),
]


@pytest.mark.parametrize("call, read, expected", NUMPY_NUMBERS_TAKEN)
def test_numpy_numbers_are_taken_as_the_python_numbers_they_are(call, read, expected, tmp_path):
    taken = read(call(tmp_path))
    assert taken == expected
    if not isinstance(expected, tuple):
        taken, expected = (taken,), (expected,)
    assert [type(value) for value in taken] == [type(value) for value in expected]


FLOAT_FOR_AN_INTEGER_REFUSED = [
    *[
        pytest.param(
            lambda _, argument=argument: data.describe(
                np.zeros((40, 2), "float32"), **{argument: 8.0}
            ),
            argument,
            id=f"data.describe-{argument}",
        )
        for argument in ("global_batch_size", "per_replica_batch_size", "num_samples")
    ],
    pytest.param(
        lambda _: data.distribute(np.arange(4), global_batch_size=2, seed=1.5),
        "seed",
        id="data.distribute-seed",
    ),
    *[
        pytest.param(
            lambda _, argument=argument: launcher.launch(
                [sys.executable, "-c", "pass"], **{"num_workers": 1, argument: 2.0}
            ),
            argument,
            id=f"launcher.launch-{argument}",
        )
        for argument in ("num_workers", "cpu_devices", "port_base", "max_restarts")
    ],
    pytest.param(lambda _: keras_scaling.use_logical_cpus(1.0), "n", id="use_logical_cpus"),
    pytest.param(
        lambda _: utilization.utilization(3.2e6, 1e4, 2.0),
        "num_replicas",
        id="utilization.utilization",
    ),
    pytest.param(
        lambda _: peak_flops.measure_matmul_flops_per_sec("/device:CPU:0", repeats=2.0),
        "repeats",
        id="peak_flops.measure_matmul_flops_per_sec",
    ),
    pytest.param(
        lambda _: keras_scaling.throughput.speedup(1800.0, 1000.0, num_replicas=2.0),
        "num_replicas",
        id="throughput.speedup",
    ),
    pytest.param(
        lambda _: keras_scaling.ReplicaSyncCheck(5.0), "every_n_steps", id="ReplicaSyncCheck"
    ),
    pytest.param(
        lambda tmp_path: keras_scaling.ThroughputLogger(tmp_path, warmup_steps=2.0),
        "warmup_steps",
        id="ThroughputLogger",
    ),
    pytest.param(
        lambda tmp_path: keras_scaling.BackupAndRestore(tmp_path, save_every_n_steps=3.0),
        "save_every_n_steps",
        id="BackupAndRestore",
    ),
    pytest.param(lambda _: _doctor_checks(size_mb=1, rounds=1.0), "rounds", id="doctor.run_checks"),
]


@pytest.mark.parametrize("call, parameter", FLOAT_FOR_AN_INTEGER_REFUSED)
def test_a_float_where_an_integer_is_due_is_a_type_error_naming_the_parameter(
    call, parameter, tmp_path
):
    with pytest.raises(TypeError, match=rf"^{parameter} must be .*, got float "):
        call(tmp_path)
