"""Peak FLOPs per second of one replica's device: a datasheet table, or measured.

MFU (model FLOPs utilization) divides the FLOPs a model achieves by the
device's peak. The peaks here are dense figures (no structured sparsity:
NVIDIA's datasheets quote Tensor Core figures "with sparsity", twice the
dense figure; the table holds half of those) for the compute dtype of the
Keras dtype policy: `"float32"`, `"tf32"` (float32 on Ampere and newer GPUs,
where TensorFlow runs matrix multiplies and convolutions in TensorFloat-32
unless `tf.config.experimental.enable_tensor_float_32_execution(False)`),
`"float16"` and `"bfloat16"`. A dtype a device has no fast path for is
absent.

A GPU is recognised by the name `tf.config.experimental.get_device_details`
gives; a TPU by the accelerator type Cloud TPU VMs set in the environment
(`TPU_ACCELERATOR_TYPE` or `ACCELERATOR_TYPE`, such as `v5litepod-8`). On
CPUs there is no table: `"measure"` times a large matrix multiply on one
device and takes that as the achievable peak (a measured figure, not a
datasheet one).
"""

import dataclasses
import logging
import os
import re
import time
from collections.abc import Mapping
from typing import Any

from keras_scaling import _threads, _validation

__all__ = [
    "PEAK_FLOPS",
    "Peak",
    "device_key",
    "faster_dtypes",
    "lookup",
    "measure_matmul_flops_per_sec",
    "resolve",
]

logger = logging.getLogger("keras_scaling")

_T = 1e12
# FLOPs per second of one device (one TensorFlow replica), dense, by compute dtype.
PEAK_FLOPS = {
    # NVIDIA V100 datasheet (volta-v100-datasheet-update-us-1165301-r5): SXM2
    # 15.7 TFLOPS FP32, 125 Tensor; PCIe 14 and 112. No TF32, no bfloat16.
    "V100 SXM2": {"float32": 15.7 * _T, "float16": 125 * _T},
    "V100 PCIe": {"float32": 14 * _T, "float16": 112 * _T},
    # NVIDIA T4 datasheet (t4-tensor-core-datasheet-951643): 8.1 FP32, 65 FP16.
    "T4": {"float32": 8.1 * _T, "float16": 65 * _T},
    # NVIDIA A10 datasheet (a10-datasheet; the A10G is AWS' A10): 31.2 FP32,
    # TF32 125 sparse, BF16/FP16 250 sparse.
    "A10G": {"float32": 31.2 * _T, "tf32": 62.5 * _T, "float16": 125 * _T, "bfloat16": 125 * _T},
    # NVIDIA L4 datasheet: 30.3 FP32, TF32 120 sparse, BF16/FP16 242 sparse.
    "L4": {"float32": 30.3 * _T, "tf32": 60 * _T, "float16": 121 * _T, "bfloat16": 121 * _T},
    # NVIDIA L40S datasheet: 91.6 FP32, TF32 366 sparse, BF16/FP16 733 sparse.
    "L40S": {"float32": 91.6 * _T, "tf32": 183 * _T, "float16": 366 * _T, "bfloat16": 366 * _T},
    # NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4), SXM
    # and PCIe alike: 19.5 FP32, TF32 312 sparse, BF16/FP16 624 sparse.
    "A100": {"float32": 19.5 * _T, "tf32": 156 * _T, "float16": 312 * _T, "bfloat16": 312 * _T},
    # NVIDIA H100 datasheet: SXM 67 FP32, TF32 989, BF16/FP16 1979 sparse;
    # PCIe 51 FP32, TF32 756, BF16/FP16 1513 sparse.
    "H100 SXM": {
        "float32": 67 * _T,
        "tf32": 494.5 * _T,
        "float16": 989.5 * _T,
        "bfloat16": 989.5 * _T,
    },
    "H100 PCIe": {
        "float32": 51 * _T,
        "tf32": 378 * _T,
        "float16": 756.5 * _T,
        "bfloat16": 756.5 * _T,
    },
    # NVIDIA H200 datasheet (SXM): 67 FP32, TF32 989, BF16/FP16 1979 sparse.
    "H200": {"float32": 67 * _T, "tf32": 494.5 * _T, "float16": 989.5 * _T, "bfloat16": 989.5 * _T},
    # NVIDIA HGX B200 datasheet, 8 GPUs: 600 TFLOPS FP32, TF32 18 PFLOPS and
    # BF16/FP16 36 PFLOPS sparse; per GPU 75, 1125 and 2250 dense.
    "B200": {"float32": 75 * _T, "tf32": 1125 * _T, "float16": 2250 * _T, "bfloat16": 2250 * _T},
    # Google Cloud TPU system architecture pages, bfloat16 per chip: v2 45,
    # v3 123, v4 275, v5e 197, v5p 459, v6e (Trillium) 918 TFLOPS. v2 and v3
    # chips hold 2 TensorCores, each a replica of its own; v4 and v5p show one
    # device per chip (megacore). float32 matrix multiplies run as bfloat16
    # passes on the MXU by default, so float32 shares the bfloat16 figure.
    "TPU v2": {"bfloat16": 22.5 * _T, "float32": 22.5 * _T},
    "TPU v3": {"bfloat16": 61.5 * _T, "float32": 61.5 * _T},
    "TPU v4": {"bfloat16": 275 * _T, "float32": 275 * _T},
    "TPU v5e": {"bfloat16": 197 * _T, "float32": 197 * _T},
    "TPU v5p": {"bfloat16": 459 * _T, "float32": 459 * _T},
    "TPU v6e": {"bfloat16": 918 * _T, "float32": 918 * _T},
}

# (pattern of the name TensorFlow reports, table key), first match wins.
_GPU_NAMES = (
    (r"V100.*PCI", "V100 PCIe"),
    (r"V100", "V100 SXM2"),
    (r"\bT4\b", "T4"),
    (r"\bA10G?\b", "A10G"),
    (r"\bL40S\b", "L40S"),
    (r"\bL4\b", "L4"),
    (r"\bA100\b", "A100"),
    (r"\bH100\b.*NVL", None),
    (r"\bH100\b.*PCI", "H100 PCIe"),
    (r"\bH100\b", "H100 SXM"),
    (r"\bH200\b", "H200"),
    (r"\bB200\b", "B200"),
)
_TPU_TYPES = (
    (r"^v2", "TPU v2"),
    (r"^v3", "TPU v3"),
    (r"^v4", "TPU v4"),
    (r"^v5(e|lite)", "TPU v5e"),
    (r"^v5p", "TPU v5p"),
    (r"^v6e", "TPU v6e"),
)
# Compute capability from which float32 runs as TF32 (Ampere).
_TF32_COMPUTE_CAPABILITY = (8, 0)
_MATMUL_SIZE = 2048
_MATMUL_REPEATS = 5


@dataclasses.dataclass(frozen=True)
class Peak:
    """The peak FLOPs per second of one replica, and where the figure comes from.

    Args:
        flops_per_sec: float, dense peak of one replica's device.
        source: str, shown to users, such as `"datasheet: A100, tf32"` or
            `"measured: 2048x2048 float32 matmul on /device:CPU:0"`.
        device: str, the `PEAK_FLOPS` key of a datasheet figure, else None.

    Example:

    ```python
    peak = lookup("A100", "bfloat16")
    peak.flops_per_sec, peak.source   # (312e12, 'datasheet: A100, bfloat16')
    ```
    """

    flops_per_sec: float
    source: str
    device: str | None = None


def device_key(
    device_kind: str,
    device_details: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The `PEAK_FLOPS` key of a device, or None when it is not in the table.

    Args:
        device_kind: str, `"GPU"`, `"TPU"` or `"CPU"`.
        device_details: dict, for a GPU what
            `tf.config.experimental.get_device_details` gives
            (`device_name`, `compute_capability`).
        environ: mapping, the environment (default `os.environ`), where
            Cloud TPU VMs name the accelerator type.

    Returns:
        str or None.

    Example:

    ```python
    device_key("GPU", {"device_name": "NVIDIA A100-SXM4-80GB"})   # 'A100'
    device_key("TPU", environ={"TPU_ACCELERATOR_TYPE": "v5litepod-8"})  # 'TPU v5e'
    ```
    """
    if device_kind == "GPU":
        name = (device_details or {}).get("device_name") or ""
        for pattern, key in _GPU_NAMES:
            if re.search(pattern, name, re.IGNORECASE):
                return key
        return None
    if device_kind == "TPU":
        environ = os.environ if environ is None else environ
        accelerator = environ.get("TPU_ACCELERATOR_TYPE") or environ.get("ACCELERATOR_TYPE") or ""
        for pattern, key in _TPU_TYPES:
            if re.search(pattern, accelerator.strip().lower()):
                return key
    return None


def lookup(
    key: str,
    compute_dtype: str,
    *,
    compute_capability: tuple[int, int] | None = None,
    tf32_enabled: bool = True,
) -> Peak | None:
    """The datasheet `Peak` of a table device for a compute dtype, or None.

    float32 becomes TF32 on GPUs of compute capability 8.0 and newer while
    TensorFlow's TensorFloat-32 execution is enabled (its default).

    Args:
        key: str, a `PEAK_FLOPS` key.
        compute_dtype: str, the dtype policy's compute dtype, such as
            `"float32"` or `"bfloat16"`.
        compute_capability: tuple `(major, minor)` of a GPU, or None.
        tf32_enabled: bool, whether TensorFloat-32 execution is enabled.

    Returns:
        A `Peak`, or None when the device has no figure for the dtype.

    Example:

    ```python
    lookup("A100", "float32", compute_capability=(8, 0)).source
    # 'datasheet: A100, tf32'
    ```
    """
    figures = PEAK_FLOPS.get(key)
    if figures is None:
        return None
    dtype = str(compute_dtype)
    if (
        dtype == "float32"
        and tf32_enabled
        and "tf32" in figures
        and tuple(compute_capability or (0, 0)) >= _TF32_COMPUTE_CAPABILITY
    ):
        dtype = "tf32"
    if dtype not in figures:
        return None
    return Peak(flops_per_sec=figures[dtype], source=f"datasheet: {key}, {dtype}", device=key)


def faster_dtypes(peak: Peak) -> list[tuple[str, float]]:
    """The float16/bfloat16 figures of the table device of `peak` that beat it.

    Args:
        peak: a `Peak` from `lookup` (measured or given peaks have no table
            device, and get an empty list).

    Returns:
        A list of `(dtype, times faster)`, fastest first; empty when none.

    Example:

    ```python
    faster_dtypes(lookup("A100", "float32", compute_capability=(8, 0)))
    # [('bfloat16', 2.0), ('float16', 2.0)]
    ```
    """
    figures = PEAK_FLOPS.get(peak.device or "")  # a measured or given peak has no device
    if figures is None:
        return []
    faster = [
        (dtype, figures[dtype] / peak.flops_per_sec)
        for dtype in ("bfloat16", "float16")
        if figures.get(dtype, 0) > peak.flops_per_sec
    ]
    return sorted(faster, key=lambda item: -item[1])


def measure_matmul_flops_per_sec(
    device: str,
    compute_dtype: str = "float32",
    *,
    size: int = _MATMUL_SIZE,
    repeats: int = _MATMUL_REPEATS,
) -> Peak:
    """Times a `size` x `size` matrix multiply on one device; its best FLOPs/sec.

    The achievable peak of a device without a datasheet figure (CPUs): the
    best of `repeats` timed runs of a chain of 4 matrix multiplies, after a
    run that is not timed. It runs in a thread of its own, outside any
    strategy's scope.

    Args:
        device: str, such as `"/device:CPU:0"`.
        compute_dtype: str, the dtype to multiply in.
        size: int, the matrices' side.
        repeats: int, timed runs.

    Returns:
        A `Peak` labelled as measured.

    Example:

    ```python
    peak = measure_matmul_flops_per_sec("/device:CPU:0")
    peak.source   # 'measured: 2048x2048 float32 matmul on /device:CPU:0'
    ```
    """
    size = _validation.positive_int(size, "size")
    repeats = _validation.positive_int(repeats, "repeats")
    import tensorflow as tf

    chain = 4

    def run() -> float:
        with tf.device(device):
            a = tf.random.stateless_uniform((size, size), (1, 2), dtype=tf.float32)
            a = tf.cast(a, compute_dtype)

            @tf.function
            def multiply(x: tf.Tensor) -> tf.Tensor:
                for _ in range(chain):
                    x = tf.matmul(x, a)
                return x

            multiply(a).numpy()
            best_s = float("inf")
            for _ in range(repeats):
                start_s = time.perf_counter()
                multiply(a).numpy()
                best_s = min(best_s, time.perf_counter() - start_s)
        return chain * 2 * size**3 / best_s

    flops_per_sec = _threads.run_outside_strategy(run, "peak")
    return Peak(
        flops_per_sec=flops_per_sec,
        source=f"measured: {size}x{size} {compute_dtype} matmul on {device}",
    )


def resolve(
    peak_flops: float | str, *, device_kind: str, device: str, compute_dtype: str
) -> tuple[Peak, None] | tuple[None, str]:
    """The `Peak` of one replica for a `peak_flops` argument, or `(None, reason)`.

    Args:
        peak_flops: a positive number (FLOPs/sec of one replica), `"auto"`
            (the table) or `"measure"` (time a matrix multiply on `device`).
        device_kind: str, `"GPU"`, `"TPU"` or `"CPU"`.
        device: str, one replica's device, such as `"/device:GPU:0"`.
        compute_dtype: str, the dtype policy's compute dtype.

    Returns:
        `(Peak, None)` or `(None, reason)`.

    Example:

    ```python
    resolve(100e12, device_kind="GPU", device="/device:GPU:0",
            compute_dtype="float32")
    # (Peak(flops_per_sec=1e+14, source='given'), None)
    ```
    """
    peak_flops = _validation.positive_number_or_one_of(
        peak_flops, "peak_flops", ("auto", "measure"), unit="FLOPs/sec of one replica"
    )
    if isinstance(peak_flops, float):
        return Peak(flops_per_sec=peak_flops, source="given"), None
    if peak_flops == "measure":
        return measure_matmul_flops_per_sec(device, compute_dtype), None
    details, tf32_enabled = {}, True
    if device_kind == "GPU":
        import tensorflow as tf

        try:
            index = tf.DeviceSpec.from_string(device or "").device_index or 0
            gpu = tf.config.list_physical_devices("GPU")[index]
            details = tf.config.experimental.get_device_details(gpu)
        except (IndexError, ValueError, RuntimeError):
            details = {}
        tf32_enabled = tf.config.experimental.tensor_float_32_execution_enabled()
    key = device_key(device_kind, details)
    if key is None:
        name = details.get("device_name") or device_kind
        hint = " or peak_flops='measure'" if device_kind == "CPU" else ""
        return None, (
            f"the peak FLOP/s of {name} is not in keras_scaling's table of "
            f"datasheet figures; MFU needs peak_flops=<FLOP/s of one replica>{hint}"
        )
    peak = lookup(
        key,
        compute_dtype,
        compute_capability=details.get("compute_capability"),
        tf32_enabled=tf32_enabled,
    )
    if peak is None:
        return None, (
            f"keras_scaling's table of datasheet figures has no {compute_dtype} "
            f"peak FLOP/s of {key}; MFU needs peak_flops=<FLOP/s of one replica>"
        )
    return peak, None
