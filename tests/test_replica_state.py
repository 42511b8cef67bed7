"""The replica state core: fingerprints, copy comparison, causes, checker.

The comparison of copies is pure NumPy and is tested with made-up arrays and
no strategy; the fingerprint tests run in the one-device session; the
variable discovery and checker tests run on a real MirroredStrategy over 2
logical CPUs, with the default all-reduce and with `ReductionToOneDevice`.
"""

import dataclasses
import subprocess
import sys
import types

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from keras_scaling.replica_sync import _copy_comparison, _fingerprint, replica_state
from keras_scaling.replica_sync.replica_sync_check import check_is_due

# --- fingerprints -------------------------------------------------------------

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "bool"]
SHAPES = [(), (3,), (5, 7), (2, 3, 4)]


def _random_array(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "bfloat16":
        return rng.normal(size=shape).astype(ml_dtypes.bfloat16)
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.normal(size=shape).astype(dtype)


def _fingerprint_numpy(array):
    """The fingerprint computed with NumPy on the host: the reference."""
    array = np.asarray(array)
    if array.dtype == np.bool_:
        array = array.astype(np.uint8)
    raw = np.ascontiguousarray(array).reshape(-1)
    if raw.nbytes % 8 == 0:
        words = raw.view(np.uint64)
    else:
        words = raw.view(f"i{array.dtype.itemsize}").astype(np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        multipliers = np.arange(words.size, dtype=np.uint64) * np.uint64(
            _fingerprint._POSITION_STEP % 2**64
        ) + np.uint64(1)
        return np.int64(np.sum(words * multipliers, dtype=np.uint64).astype(np.int64))


def _flip_lowest_bit(array, index):
    changed = np.array(array, copy=True)
    flat = changed.reshape(-1)
    if changed.dtype == np.bool_:
        flat[index] = not flat[index]
    else:
        bits = flat.view(f"u{changed.dtype.itemsize}")
        bits[index] ^= 1
    return changed


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fingerprint_on_device_equals_the_numpy_reference(dtype, shape):
    array = _random_array(dtype, shape)
    on_device = _fingerprint.fingerprint_table([tf.constant(array)])[0].numpy()
    assert on_device == _fingerprint_numpy(array)


@pytest.mark.parametrize("device", ["/CPU:0", "/GPU:0"], ids=["cpu-product", "gpu-sum"])
def test_fingerprint_table_of_tensors_of_several_lengths_equals_the_numpy_reference(device):
    # Under "/GPU:0" the function takes the elementwise form (GPUs have no
    # int64 matrix product); soft placement runs it on this machine's CPU.
    arrays = [
        _random_array(dtype, shape, seed=index)
        for index, (dtype, shape) in enumerate(
            [("float32", (64, 33)), ("float64", (5,)), ("float16", (7,)), ("int64", (1000,))]
        )
    ]
    tensors = [tf.constant(array) for array in arrays]

    @tf.function
    def table():
        with tf.device(device):
            return _fingerprint.fingerprint_table([tf.identity(t) for t in tensors])

    tf.config.set_soft_device_placement(True)
    assert table().numpy().tolist() == [_fingerprint_numpy(a) for a in arrays]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fingerprint_changes_when_any_single_element_changes_its_lowest_bit(dtype):
    array = _random_array(dtype, (3, 5), seed=1)
    original = _fingerprint.fingerprint_table([tf.constant(array)])[0].numpy()
    for index in range(array.size):
        changed = _fingerprint.fingerprint_table([tf.constant(_flip_lowest_bit(array, index))])[0]
        assert changed.numpy() != original, index


def test_fingerprint_changes_with_one_ulp_of_one_element_of_a_large_tensor():
    array = np.random.default_rng(2).normal(size=(257, 129)).astype(np.float32)
    changed = array.copy()
    changed[200, 100] = np.nextafter(changed[200, 100], np.float32(np.inf))
    table = _fingerprint.fingerprint_table([tf.constant(array), tf.constant(changed)])
    assert table.shape == (2,)
    assert table[0] != table[1]


def test_fingerprint_changes_when_an_element_becomes_nan():
    array = np.float32([1.0, -2.0, 3.5, 4.0])
    with_nan = array.copy()
    with_nan[1] = np.nan
    fingerprints = _fingerprint.fingerprint_table([tf.constant(array), tf.constant(with_nan)])
    assert fingerprints[0] != fingerprints[1]


def _with_words_changed(array, changes):
    """`array` with its 64-bit words `{index: delta}` changed by `delta`, modulo 2**64."""
    changed = np.array(array, copy=True)
    words = changed.reshape(-1).view(np.uint64)
    for index, delta in changes.items():
        words[index] = (int(words[index]) + delta) % 2**64
    return changed


def test_fingerprint_changes_when_two_elements_trade_places():
    array = np.random.default_rng(3).normal(size=(16, 8)).astype(np.float32)
    swapped = array.copy()
    # Both are the low halves of their 64-bit words.
    swapped[2, 4], swapped[11, 0] = array[11, 0], array[2, 4]
    # The plain sum of 64-bit words this fingerprint replaced cannot see it.
    assert array.view(np.uint64).sum(dtype=np.uint64) == swapped.view(np.uint64).sum(
        dtype=np.uint64
    )
    table = _fingerprint.fingerprint_table([tf.constant(array), tf.constant(swapped)])
    assert table[0] != table[1]


@pytest.mark.parametrize("k", [1, 2**20, 2**40 + 7, 2**62])
def test_fingerprint_changes_when_two_words_change_by_plus_and_minus_k(k):
    array = np.random.default_rng(4).normal(size=(8, 8)).astype(np.float64)
    cancelling = _with_words_changed(array, {3: k, 40: -k})
    table = _fingerprint.fingerprint_table([tf.constant(array), tf.constant(cancelling)])
    assert table[0] != table[1]


def test_fingerprint_sees_every_swap_of_two_elements_of_a_small_kernel():
    array = np.random.default_rng(5).normal(size=(6, 5)).astype(np.float64)
    flat = array.reshape(-1)
    swaps = [(i, j) for i in range(flat.size) for j in range(i + 1, flat.size)]
    tensors = [tf.constant(array)]
    for i, j in swaps:
        swapped = flat.copy()
        swapped[i], swapped[j] = flat[j], flat[i]
        tensors.append(tf.constant(swapped.reshape(array.shape)))
    table = _fingerprint.fingerprint_table(tensors).numpy()
    assert np.count_nonzero(table[1:] == table[0]) == 0
    assert len(set(table.tolist())) == len(tensors)


# --- comparing copies ---------------------------------------------------------


def test_compare_copies_measures_the_differences_from_replica_0():
    reference = np.float32([[1.0, 2.0], [4.0, 8.0]])
    second = reference.copy()
    second[1, 1] = 10.0
    third = reference.copy()
    third[0, 0] = 0.5
    difference = _copy_comparison.compare_copies([reference, reference.copy(), second, third])
    assert difference.differing_replicas == (2, 3)
    assert difference.num_differing_elements == 2
    assert difference.num_elements == 4
    assert difference.max_abs_diff == pytest.approx(2.0)
    assert difference.max_rel_diff == pytest.approx(0.5)
    assert not difference.within_tolerance


def test_compare_copies_of_equal_copies_finds_nothing():
    reference = np.arange(6, dtype=np.int64).reshape(2, 3)
    difference = _copy_comparison.compare_copies([reference, reference.copy()])
    assert difference.differing_replicas == ()
    assert difference.num_differing_elements == 0
    assert difference.max_abs_diff == 0.0


def test_compare_copies_sees_one_ulp():
    reference = np.float32([1.0, 3.0])
    changed = reference.copy()
    changed[1] = np.nextafter(changed[1], np.float32(4.0))
    difference = _copy_comparison.compare_copies([reference, changed])
    assert difference.differing_replicas == (1,)
    assert difference.num_differing_elements == 1
    assert difference.max_abs_diff == pytest.approx(2.0**-22)


def test_compare_copies_is_bitwise_so_negative_zero_differs():
    difference = _copy_comparison.compare_copies([np.float32([0.0]), np.float32([-0.0])])
    assert difference.differing_replicas == (1,)
    assert difference.max_abs_diff == 0.0


def test_compare_copies_counts_nan_and_inf_per_replica():
    reference = np.float32([1.0, 2.0, 3.0])
    broken = np.float32([np.nan, np.inf, 3.0])
    difference = _copy_comparison.compare_copies([reference, broken])
    assert difference.nan_counts == (0, 1)
    assert difference.inf_counts == (0, 1)
    assert difference.max_abs_diff == np.inf
    assert difference.num_differing_elements == 2


def test_compare_copies_within_tolerance_only_when_every_difference_is():
    reference = np.float32([1.0, 100.0])
    close = np.float32([1.0 + 1e-6, 100.0 + 1e-4])
    assert _copy_comparison.compare_copies(
        [reference, close], atol=1e-5, rtol=1e-5
    ).within_tolerance
    assert not _copy_comparison.compare_copies([reference, close], atol=1e-5).within_tolerance
    assert not _copy_comparison.compare_copies([reference, close]).within_tolerance


def test_comparison_of_copies_imports_neither_keras_nor_tensorflow():
    code = (
        "import sys, keras_scaling.replica_sync._copy_comparison; "
        "print(sorted({'keras', 'tensorflow'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_differing_columns_are_the_variables_whose_fingerprints_differ_on_any_replica():
    table = np.int64([[7, 1, 5, 9], [7, 2, 5, 9], [7, 1, 5, -9]])
    assert _copy_comparison.differing_columns(table) == [1, 3]
    assert _copy_comparison.differing_columns(np.zeros([2, 0], np.int64)) == []


@pytest.mark.parametrize(
    "is_per_replica_state, mode, within_tolerance, expected",
    [
        (True, "warn", False, _copy_comparison.PER_REPLICA_STATE),
        (True, "average", True, _copy_comparison.PER_REPLICA_STATE),
        (True, "error", False, _copy_comparison.DIVERGENCE),
        (True, "error", True, _copy_comparison.FLOAT_DRIFT),
        (False, "warn", True, _copy_comparison.FLOAT_DRIFT),
        (False, "warn", False, _copy_comparison.DIVERGENCE),
    ],
)
def test_tier_of_a_difference(is_per_replica_state, mode, within_tolerance, expected):
    difference = _difference(within_tolerance=within_tolerance)
    assert _copy_comparison.tier_of(is_per_replica_state, mode, difference) == expected


def test_mean_copy_keeps_the_dtype_and_rounds_integers():
    floats = _copy_comparison.mean_copy([np.float16([1.0, 60000.0]), np.float16([2.0, 60000.0])])
    assert floats.dtype == np.float16 and floats.tolist() == [1.5, 60000.0]
    integers = _copy_comparison.mean_copy([np.int64([1, 4]), np.int64([2, 4]), np.int64([2, 5])])
    assert integers.dtype == np.int64 and integers.tolist() == [2, 4]


# --- likely causes ------------------------------------------------------------


def _variable(role, aggregation="NONE", reason=None):
    # What `likely_cause` reads of a `TrackedVariable`, without TensorFlow.
    return types.SimpleNamespace(
        path="model/layer/w", role=role, aggregation=aggregation, per_replica_reason=reason
    )


def _difference(nan_counts=(0, 0), within_tolerance=False):
    return _copy_comparison.CopyDifference(
        differing_replicas=(1,),
        num_differing_elements=1,
        num_elements=2,
        max_abs_diff=1.0,
        max_rel_diff=1.0,
        nan_counts=nan_counts,
        inf_counts=(0, 0),
        within_tolerance=within_tolerance,
    )


@pytest.mark.parametrize(
    "role, aggregation, expected",
    [
        (_copy_comparison.TRAINABLE, "NONE", "gradients were not combined"),
        (_copy_comparison.NON_TRAINABLE, "NONE", "aggregation 'none' assigned in replica context"),
        (_copy_comparison.NON_TRAINABLE, "MEAN", "aggregation 'mean'"),
        (
            _copy_comparison.OPTIMIZER_ITERATIONS,
            "ONLY_FIRST_REPLICA",
            "optimizer steps were applied on some replicas",
        ),
        (
            _copy_comparison.OPTIMIZER_VARIABLE,
            "NONE",
            "optimizer state was updated with per-replica",
        ),
        (_copy_comparison.SEED_GENERATOR, "NONE", "seed generator advanced"),
    ],
)
def test_likely_cause_follows_the_role_and_aggregation(role, aggregation, expected):
    assert expected in _copy_comparison.likely_cause(_variable(role, aggregation), _difference())


def test_likely_cause_of_nan_on_one_replica_names_that_replica():
    cause = _copy_comparison.likely_cause(
        _variable(_copy_comparison.TRAINABLE), _difference(nan_counts=(0, 3))
    )
    assert cause.startswith("NaN/Inf on replica(s) 1 only")


def test_likely_cause_within_tolerance_is_float_drift():
    cause = _copy_comparison.likely_cause(
        _variable(_copy_comparison.TRAINABLE), _difference(within_tolerance=True)
    )
    assert cause.startswith("float drift")


def test_report_str_names_step_variable_replica_device_and_cause():
    variable = _variable(_copy_comparison.TRAINABLE)
    report = _copy_comparison.ReplicaSyncReport(
        step=42,
        num_replicas=2,
        num_workers=1,
        num_variables=7,
        variables=(
            _copy_comparison.VariableReport(
                path=variable.path,
                shape=(2,),
                dtype="float32",
                aggregation="NONE",
                synchronization="ON_WRITE",
                role=variable.role,
                tier=_copy_comparison.DIVERGENCE,
                difference=_difference(nan_counts=(0, 1)),
                devices=("/device:CPU:1",),
                likely_cause="the cause",
            ),
        ),
    )
    text = str(report)
    assert "step 42: 7 variables on 2 replicas (1 worker): 1 diverged" in text
    assert "DIVERGENCE: model/layer/w shape=(2,) dtype=float32 aggregation=NONE" in text
    assert "replicas differing from replica 0: 1 (/device:CPU:1)" in text
    assert "replica 1: 1 NaN/0 Inf" in text
    assert "likely cause: the cause" in text
    assert not report.ok and report.max_abs_diff == 1.0


def _report(tier, max_abs_diff):
    difference = dataclasses.replace(_difference(), max_abs_diff=max_abs_diff)
    return _copy_comparison.VariableReport(
        path=f"model/{tier}",
        shape=(2,),
        dtype="float32",
        aggregation="NONE",
        synchronization="ON_WRITE",
        role=_copy_comparison.TRAINABLE,
        tier=tier,
        difference=difference,
        devices=("/device:CPU:1",),
        likely_cause="the cause",
    )


def test_report_sorts_variables_by_tier_and_per_replica_state_is_not_divergence():
    drift = _report(_copy_comparison.FLOAT_DRIFT, 1e-7)
    state = _report(_copy_comparison.PER_REPLICA_STATE, 5.0)
    report = _copy_comparison.ReplicaSyncReport(
        step=3, num_replicas=2, num_workers=1, num_variables=4, variables=(state, drift)
    )
    assert report.ok and report.divergences == ()
    assert report.float_drift == (drift,) and report.per_replica_state == (state,)
    # Per-replica state legitimately differs: it is left out of the maximum.
    assert report.max_abs_diff == 1e-7
    diverged = _report(_copy_comparison.DIVERGENCE, 0.5)
    report = dataclasses.replace(report, variables=(state, drift, diverged))
    assert not report.ok and report.divergences == (diverged,)
    assert report.max_abs_diff == 0.5


# --- the checker on a real MirroredStrategy -----------------------------------


@pytest.fixture(scope="module", params=["default all-reduce", "ReductionToOneDevice"])
def strategy(request):
    # Collective ops of two MirroredStrategy objects in one process number
    # their instances alike and clash ("Shape mismatch in the collective
    # instance 100"): this process holds one strategy with the default
    # (collective) all-reduce, and one that reduces to one device and so
    # runs no collective op.
    if request.param == "ReductionToOneDevice":
        return tf.distribute.MirroredStrategy(
            ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
        )
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _model(strategy, synchronized):
    import keras

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(3),
                keras.layers.BatchNormalization(synchronized=synchronized),
                keras.layers.Dropout(0.5),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
        model.optimizer.build(model.trainable_variables)
    return model


@pytest.mark.logical_cpus(2)
def test_tracked_variables_classify_roles_and_per_replica_state(strategy):
    model = _model(strategy, synchronized=False)
    tracked = {v.path: v for v in replica_state.tracked_variables(model, model.optimizer)}
    batch_norm = model.layers[1]
    assert tracked[model.layers[0].kernel.path].role == replica_state.TRAINABLE
    assert tracked[batch_norm.moving_mean.path].is_per_replica_state
    assert tracked[batch_norm.moving_variance.path].is_per_replica_state
    assert not tracked[batch_norm.gamma.path].is_per_replica_state
    assert tracked[model.optimizer.iterations.path].role == replica_state.OPTIMIZER_ITERATIONS
    seed_state = model.layers[2].seed_generator.state
    assert tracked[seed_state.path].role == replica_state.SEED_GENERATOR
    assert len(tracked) == len(model.variables) + len(model.optimizer.variables)


def _keras_variables_take_synchronization():
    import inspect

    import keras

    return "synchronization" in inspect.signature(keras.Variable.__init__).parameters


@pytest.mark.logical_cpus(2)
@pytest.mark.skipif(
    not _keras_variables_take_synchronization(),
    reason="this Keras (3.8) cannot create ON_READ variables: keras.Variable "
    "has no synchronization argument",
)
def test_on_read_variables_are_per_replica_state(strategy):
    import keras

    class RunningTotal(keras.layers.Layer):
        def build(self, input_shape):
            self.total = keras.Variable(
                0.0,
                trainable=False,
                aggregation="sum",
                synchronization="on_read",
                name="total",
            )

        def call(self, inputs):
            return inputs

    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), RunningTotal()])
    (tracked,) = replica_state.tracked_variables(model)
    assert (tracked.synchronization, tracked.aggregation) == ("ON_READ", "SUM")
    assert tracked.per_replica_reason.startswith("synchronization ON_READ")


@pytest.mark.logical_cpus(2)
def test_synchronized_batch_norm_statistics_are_not_per_replica_state(strategy):
    model = _model(strategy, synchronized=True)
    tracked = replica_state.tracked_variables(model)
    assert not any(v.is_per_replica_state for v in tracked)


@pytest.mark.logical_cpus(2)
def test_checker_fingerprints_each_replicas_own_copy(strategy):
    model = _model(strategy, synchronized=False)
    variables = replica_state.tracked_variables(model, model.optimizer)
    checker = replica_state.ReplicaStateChecker(strategy, variables)
    table = checker.fingerprints()
    assert table.shape == (2, len(variables))
    np.testing.assert_array_equal(table[0], table[1])
    kernel = model.layers[0].kernel
    copies = strategy.experimental_local_results(kernel.value)
    copies[1].assign(copies[1] * 2.0)
    table = checker.fingerprints()
    index = [v.path for v in variables].index(kernel.path)
    differing = np.flatnonzero(table[0] != table[1])
    assert differing.tolist() == [index]


@pytest.mark.logical_cpus(2)
def test_checker_sees_two_elements_of_a_kernel_swapped_on_one_replica(strategy):
    model = _model(strategy, synchronized=True)
    kernel = model.layers[0].kernel
    copies = strategy.experimental_local_results(kernel.value)
    values = copies[1].numpy()
    values[0, 0], values[3, 2] = values[3, 2], values[0, 0]
    assert values[0, 0] != values[3, 2]
    copies[1].assign(values)
    checker = replica_state.ReplicaStateChecker(strategy, replica_state.tracked_variables(model))

    (diverged,) = checker.check(step=3).divergences

    assert diverged.path == kernel.path
    assert diverged.devices == (strategy.extended.worker_devices[1],)


@pytest.mark.logical_cpus(2)
def test_checker_sees_two_elements_whose_bits_change_by_plus_and_minus_k_on_one_replica(
    strategy,
):
    model = _model(strategy, synchronized=True)
    kernel = model.layers[0].kernel  # float32 [4, 3]: six 64-bit words
    copies = strategy.experimental_local_results(kernel.value)
    k = 2**33 + 5
    changed = _with_words_changed(copies[1].numpy(), {0: k, 4: -k})
    copies[1].assign(changed)
    checker = replica_state.ReplicaStateChecker(strategy, replica_state.tracked_variables(model))

    (diverged,) = checker.check(step=3).divergences

    assert diverged.path == kernel.path
    assert diverged.difference.num_differing_elements == 4


@pytest.mark.logical_cpus(2)
def test_checker_gathers_every_replicas_copy_in_replica_order(strategy):
    model = _model(strategy, synchronized=False)
    variables = replica_state.tracked_variables(model)
    checker = replica_state.ReplicaStateChecker(strategy, variables)
    bias = model.layers[-1].bias
    strategy.experimental_local_results(bias.value)[1].assign([5.0])
    index = [v.path for v in variables].index(bias.path)
    (copies,) = checker.gather([index])
    assert [float(c[0]) for c in copies] == [0.0, 5.0]


@pytest.mark.logical_cpus(2)
def test_checker_average_replaces_per_replica_state_by_its_mean(strategy):
    model = _model(strategy, synchronized=False)
    moving_mean = model.layers[1].moving_mean
    copies = strategy.experimental_local_results(moving_mean.value)
    copies[0].assign([1.0, 2.0, 3.0])
    copies[1].assign([3.0, 4.0, 5.0])
    checker = replica_state.ReplicaStateChecker(
        strategy, replica_state.tracked_variables(model), per_replica_state="average"
    )
    report = checker.check(step=0)
    assert report.ok
    (state,) = report.per_replica_state
    assert state.path == moving_mean.path and state.repair == "averaged across replicas"
    for copy in copies:
        np.testing.assert_array_equal(copy.numpy(), [2.0, 3.0, 4.0])


@pytest.mark.logical_cpus(2)
def test_checker_rejects_unknown_per_replica_state_mode(strategy):
    with pytest.raises(ValueError, match="per_replica_state must be one of .* got 'sometimes'"):
        replica_state.ReplicaStateChecker(strategy, [], per_replica_state="sometimes")


@pytest.mark.logical_cpus(2)
def test_checker_reports_the_device_of_each_differing_replica(strategy):
    model = _model(strategy, synchronized=True)
    bias = model.layers[0].bias
    strategy.experimental_local_results(bias.value)[1].assign([1.0, 2.0, 3.0])
    checker = replica_state.ReplicaStateChecker(strategy, replica_state.tracked_variables(model))
    (diverged,) = checker.check(step=7).divergences
    assert diverged.path == bias.path
    assert diverged.devices == (strategy.extended.worker_devices[1],)
    assert diverged.devices[0].endswith("/device:CPU:1")


@pytest.mark.logical_cpus(2)
def test_checker_resync_copies_replica_0_to_every_replica(strategy):
    model = _model(strategy, synchronized=True)
    kernel = model.layers[0].kernel
    copies = strategy.experimental_local_results(kernel.value)
    replica_0 = copies[0].numpy()
    copies[1].assign(replica_0 + 1.0)
    checker = replica_state.ReplicaStateChecker(strategy, replica_state.tracked_variables(model))
    repaired = checker.resync(checker.check(step=0))
    (diverged,) = repaired.divergences
    assert diverged.path == kernel.path and diverged.repair == "resynced from replica 0"
    for copy in copies:
        np.testing.assert_array_equal(copy.numpy(), replica_0)
    assert checker.check(step=0).variables == ()


@pytest.mark.logical_cpus(2)
def test_checker_traces_its_fingerprint_function_once(strategy):
    model = _model(strategy, synchronized=True)
    checker = replica_state.ReplicaStateChecker(strategy, replica_state.tracked_variables(model))
    for step in range(3):
        checker.check(step=step)
    assert checker._fingerprint_function.experimental_get_tracing_count() == 1


def test_a_check_is_due_at_the_first_look():
    assert check_is_due(0, None, 100)


def test_a_check_is_due_once_a_multiple_of_every_n_steps_is_passed():
    assert not check_is_due(99, 0, 100)
    assert check_is_due(100, 0, 100)
    # One call of the train function may run past several multiples.
    assert check_is_due(450, 120, 100)
    assert not check_is_due(199, 120, 100)
