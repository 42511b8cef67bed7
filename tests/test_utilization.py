"""MFU arithmetic, argument checks, advice, and the peak FLOPs table."""

import pytest

from keras_scaling.mfu import peak_flops, utilization


def test_mfu_is_achieved_flops_over_the_peak_of_all_replicas():
    figures = utilization.utilization(3.2e6, 10_000.0, 2, peak_flops_per_replica=1e11)
    assert figures.tflops_per_sec == pytest.approx(0.032)
    assert figures.tflops_per_sec_per_replica == pytest.approx(0.016)
    assert figures.mfu == pytest.approx(3.2e6 * 10_000.0 / (1e11 * 2))


def test_without_a_peak_there_is_tflops_but_no_mfu():
    figures = utilization.utilization(1e9, 100.0, 4)
    assert figures.tflops_per_sec == pytest.approx(0.1)
    assert figures.mfu is None


@pytest.mark.parametrize(
    "check, value, error, message",
    [
        (
            utilization.check_flops_per_sample,
            0,
            ValueError,
            "flops_per_sample must be a positive number",
        ),
        (utilization.check_flops_per_sample, -5.0, ValueError, "got -5.0"),
        (
            utilization.check_flops_per_sample,
            "measure",
            ValueError,
            "'auto' or None, got 'measure'",
        ),
        (utilization.check_flops_per_sample, True, TypeError, "got bool"),
        (
            utilization.check_peak_flops,
            float("inf"),
            ValueError,
            "peak_flops must be a positive number",
        ),
        (
            utilization.check_peak_flops,
            "datasheet",
            ValueError,
            "'auto', 'measure' or None, got 'datasheet'",
        ),
        (utilization.check_peak_flops, [1e12], TypeError, "got list"),
    ],
)
def test_bad_flops_arguments_are_refused_saying_what_is_allowed(check, value, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        check(value)


def test_given_numbers_and_choices_pass_the_checks():
    assert utilization.check_flops_per_sample(3_000_000) == 3e6
    assert utilization.check_flops_per_sample(None) is None
    assert utilization.check_peak_flops("measure") == "measure"


def test_no_advice_unless_scaling_is_good_and_mfu_low():
    common = dict(per_replica_batch_size=32, compute_dtype="float32")
    assert utilization.underuse_advice(efficiency=0.5, mfu=0.05, **common) is None
    assert utilization.underuse_advice(efficiency=0.95, mfu=0.5, **common) is None


def test_advice_names_the_input_when_it_barely_keeps_up():
    advice = utilization.underuse_advice(
        efficiency=0.95,
        mfu=0.05,
        per_replica_batch_size=32,
        compute_dtype="float32",
        faster_dtypes=[("bfloat16", 8.0)],
        input_samples_per_sec=1100.0,
        samples_per_sec=1000.0,
    )
    assert "devices wait for input" in advice


def test_advice_names_mixed_precision_when_the_device_has_faster_dtypes():
    advice = utilization.underuse_advice(
        efficiency=0.95,
        mfu=0.05,
        per_replica_batch_size=32,
        compute_dtype="float32",
        faster_dtypes=[("bfloat16", 2.0)],
        input_samples_per_sec=1e6,
        samples_per_sec=1e3,
    )
    assert "set_global_policy('mixed_bfloat16')" in advice


def test_advice_names_the_per_replica_batch_otherwise():
    advice = utilization.underuse_advice(
        efficiency=0.95,
        mfu=0.05,
        per_replica_batch_size=16,
        compute_dtype="bfloat16",
    )
    assert "per-replica batch of 16" in advice
    assert "--per-replica-batch 16,32,64" in advice


@pytest.mark.parametrize(
    "name, key",
    [
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("Tesla T4", "T4"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GeForce GTX 1080", None),
    ],
)
def test_gpu_names_map_to_table_devices(name, key):
    assert peak_flops.device_key("GPU", {"device_name": name}) == key


@pytest.mark.parametrize(
    "accelerator, key",
    [
        ("v2-8", "TPU v2"),
        ("v3-32", "TPU v3"),
        ("v4-8", "TPU v4"),
        ("v5litepod-8", "TPU v5e"),
        ("v5p-8", "TPU v5p"),
        ("v6e-4", "TPU v6e"),
    ],
)
def test_tpu_accelerator_types_map_to_table_devices(accelerator, key):
    assert peak_flops.device_key("TPU", environ={"TPU_ACCELERATOR_TYPE": accelerator}) == key


def test_float32_on_ampere_is_tf32_and_on_volta_is_float32():
    a100 = peak_flops.lookup("A100", "float32", compute_capability=(8, 0))
    assert (a100.flops_per_sec, a100.source) == (156e12, "datasheet: A100, tf32")
    no_tf32 = peak_flops.lookup("A100", "float32", compute_capability=(8, 0), tf32_enabled=False)
    assert no_tf32.flops_per_sec == 19.5e12
    assert (
        peak_flops.lookup("V100 SXM2", "float32", compute_capability=(7, 0)).flops_per_sec
        == 15.7e12
    )


def test_a_dtype_the_device_has_no_fast_path_for_has_no_peak():
    assert peak_flops.lookup("V100 SXM2", "bfloat16") is None


def test_every_table_figure_is_dense_and_tensor_dtypes_beat_float32():
    for key, figures in peak_flops.PEAK_FLOPS.items():
        assert figures["float32"] > 1e12, key
        for dtype in ("float16", "bfloat16"):
            if dtype in figures and not key.startswith("TPU"):
                assert figures[dtype] > figures["float32"], key


def test_faster_dtypes_of_a_float32_peak():
    peak = peak_flops.lookup("A100", "float32", compute_capability=(8, 0))
    assert peak_flops.faster_dtypes(peak) == [("bfloat16", 2.0), ("float16", 2.0)]


def test_an_unknown_device_asks_for_peak_flops():
    peak, reason = peak_flops.resolve(
        "auto", device_kind="CPU", device="/device:CPU:0", compute_dtype="float32"
    )
    assert peak is None
    assert "MFU needs peak_flops=<FLOP/s of one replica> or peak_flops='measure'" in reason
    assert "PEAK_FLOPS" not in reason


def test_measure_times_a_matmul_and_says_so():
    peak = peak_flops.measure_matmul_flops_per_sec("/device:CPU:0", size=256, repeats=2)
    assert peak.flops_per_sec > 1e8
    assert peak.source == "measured: 256x256 float32 matmul on /device:CPU:0"
