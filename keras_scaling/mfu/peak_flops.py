"""Peak FLOPs per second of one replica's device: dense datasheet figures, or measured."""

import contextlib
import dataclasses
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

_T = 1e12


def _gpu(float32: float, tf32: float, half: float) -> dict[str, float]:
    return {"float32": float32 * _T, "tf32": tf32 * _T, "float16": half * _T, "bfloat16": half * _T}


def _tpu(bfloat16: float) -> dict[str, float]:
    # float32 matrix multiplies run as bfloat16 passes on the MXU by default.
    return {"bfloat16": bfloat16 * _T, "float32": bfloat16 * _T}


# FLOPs per second of one device (one TensorFlow replica), dense, by compute dtype.
PEAK_FLOPS = {
    # NVIDIA datasheets, TFLOPS. V100 and T4: FP32 and Tensor (FP16); no TF32 or bfloat16.
    "V100 SXM2": {"float32": 15.7 * _T, "float16": 125 * _T},
    "V100 PCIe": {"float32": 14 * _T, "float16": 112 * _T},
    "T4": {"float32": 8.1 * _T, "float16": 65 * _T},
    # FP32, then TF32 and BF16/FP16 "with sparsity" halved; A10G is AWS' A10; B200 is
    # HGX B200's 18 and 36 PFLOPS over its 8 GPUs.
    "A10G": _gpu(31.2, 62.5, 125),
    "L4": _gpu(30.3, 60, 121),
    "L40S": _gpu(91.6, 183, 366),
    "A100": _gpu(19.5, 156, 312),
    "H100 SXM": _gpu(67, 494.5, 989.5),
    "H100 PCIe": _gpu(51, 378, 756.5),
    "H200": _gpu(67, 494.5, 989.5),
    "B200": _gpu(75, 1125, 2250),
    # Cloud TPU architecture pages, bfloat16 per chip; v2 and v3 chips hold 2 replicas.
    "TPU v2": _tpu(22.5),
    "TPU v3": _tpu(61.5),
    "TPU v4": _tpu(275),
    "TPU v5e": _tpu(197),
    "TPU v5p": _tpu(459),
    "TPU v6e": _tpu(918),
}


@dataclasses.dataclass(frozen=True)
class Peak:
    """The peak FLOPs per second of one replica, and where the figure comes from.

    Args:
        flops_per_sec: float, dense peak of one replica's device.
        source: str, such as `"datasheet: A100, tf32"`.
        device: str, the `PEAK_FLOPS` key of a datasheet figure, else None.

    Example:

    ```python
    lookup("A100", "bfloat16").source   # 'datasheet: A100, bfloat16'
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
        device_details: for a GPU, `tf.config.experimental.get_device_details`.
        environ: the environment (default `os.environ`), for `TPU_ACCELERATOR_TYPE`.

    Returns:
        str or None.

    Example:

    ```python
    device_key("GPU", {"device_name": "NVIDIA A100-SXM4-80GB"})   # 'A100'
    ```
    """
    if device_kind == "GPU":
        name = ((device_details or {}).get("device_name") or "").upper()
        found = re.search(r"\b(V100|T4|A10G?|L40S|L4|A100|H100|H200|B200)\b", name)
        if found is None or "NVL" in name:  # H100 NVL: two GPUs, figures of their own
            return None
        model = "A10G" if found[1] == "A10" else found[1]
        if model in ("V100", "H100"):
            form = "PCIe" if "PCI" in name else "SXM2" if model == "V100" else "SXM"
            model = f"{model} {form}"
        return model
    environ = os.environ if environ is None else environ
    accelerator = environ.get("TPU_ACCELERATOR_TYPE") or environ.get("ACCELERATOR_TYPE") or ""
    # Cloud TPU accelerator types: v4-8, v5litepod-8 (a v5e), v5p-8, v6e-4.
    found = re.match(r"v(\d)(p|e|lite)?", accelerator.strip().lower())
    if device_kind != "TPU" or found is None:
        return None
    key = f"TPU v{found[1]}{'e' if found[2] == 'lite' else found[2] or ''}"
    return key if key in PEAK_FLOPS else None


def lookup(
    key: str,
    compute_dtype: str,
    *,
    compute_capability: tuple[int, int] | None = None,
    tf32_enabled: bool = True,
) -> Peak | None:
    """The datasheet `Peak` of a table device for a compute dtype, or None.

    float32 is TF32 from compute capability 8.0 while TensorFloat-32 is enabled (the default).

    Args:
        key: str, a `PEAK_FLOPS` key.
        compute_dtype: str, the dtype policy's compute dtype.
        compute_capability: tuple `(major, minor)` of a GPU, or None.
        tf32_enabled: bool, whether TensorFloat-32 execution is enabled.

    Returns:
        A `Peak`, or None when the device has no figure for the dtype.

    Example:

    ```python
    lookup("A100", "float32", compute_capability=(8, 0)).source   # 'datasheet: A100, tf32'
    ```
    """
    figures, dtype = PEAK_FLOPS.get(key, {}), str(compute_dtype)
    if dtype == "float32" and tf32_enabled and tuple(compute_capability or (0, 0)) >= (8, 0):
        dtype = "tf32" if "tf32" in figures else dtype  # Ampere and newer
    if dtype not in figures:
        return None
    return Peak(flops_per_sec=figures[dtype], source=f"datasheet: {key}, {dtype}", device=key)


def faster_dtypes(peak: Peak) -> list[tuple[str, float]]:
    """The float16/bfloat16 figures of the table device of `peak` that beat it.

    Args:
        peak: a `Peak`; measured or given peaks have no table device.

    Returns:
        A list of `(dtype, times faster)`, fastest first; empty when none.

    Example:

    ```python
    faster_dtypes(lookup("A100", "float32", compute_capability=(8, 0)))
    # [('bfloat16', 2.0), ('float16', 2.0)]
    ```
    """
    figures = PEAK_FLOPS.get(peak.device or "", {})
    times = {dtype: figures.get(dtype, 0) / peak.flops_per_sec for dtype in ("bfloat16", "float16")}
    return sorted(((d, t) for d, t in times.items() if t > 1), key=lambda item: -item[1])


def measure_matmul_flops_per_sec(
    device: str, compute_dtype: str = "float32", *, size: int = 2048, repeats: int = 5
) -> Peak:
    """The best FLOPs/sec of `repeats` timed `size` x `size` matrix multiplies on one device.

    Args:
        device: str, such as `"/device:CPU:0"`.
        compute_dtype: str, the dtype to multiply in.
        size: int, the matrices' side.
        repeats: int, timed runs.

    Returns:
        A `Peak` labelled as measured.

    Raises:
        TypeError, ValueError: `size` or `repeats` is not a positive integer.

    Example:

    ```python
    peak = measure_matmul_flops_per_sec("/device:CPU:0")
    peak.source   # 'measured: 2048x2048 float32 matmul on /device:CPU:0'
    ```
    """
    size = _validation.positive_int(size, "size")
    repeats = _validation.positive_int(repeats, "repeats")
    import tensorflow as tf

    def run() -> float:
        with tf.device(device):
            a = tf.cast(tf.random.stateless_uniform((size, size), (1, 2)), compute_dtype)
            multiply = tf.function(lambda: tf.reduce_sum(tf.matmul(a, a)))
            multiply().numpy()
            times_s = []
            for _ in range(repeats):
                start_s = time.perf_counter()
                multiply().numpy()
                times_s.append(time.perf_counter() - start_s)
        return 2 * size**3 / min(times_s)

    flops_per_sec = _threads.run_outside_strategy(run, "peak")
    source = f"measured: {size}x{size} {compute_dtype} matmul on {device}"
    return Peak(flops_per_sec=flops_per_sec, source=source)


def resolve(
    peak_flops: float | str, *, device_kind: str, device: str, compute_dtype: str
) -> tuple[Peak, None] | tuple[None, str]:
    """The `Peak` of one replica for a `peak_flops` argument, or `(None, reason)`.

    Args:
        peak_flops: FLOPs/sec of one replica, `"auto"` (the table) or `"measure"`.
        device_kind: str, `"GPU"`, `"TPU"` or `"CPU"`.
        device: str, one replica's device, such as `"/device:GPU:0"`.
        compute_dtype: str, the dtype policy's compute dtype.

    Returns:
        `(Peak, None)` or `(None, reason)`.

    Raises:
        TypeError, ValueError: `peak_flops` is none of these.

    Example:

    ```python
    resolve(100e12, device_kind="GPU", device="/device:GPU:0",
            compute_dtype="float32")
    # (Peak(flops_per_sec=1e+14, source='given', device=None), None)
    ```
    """
    peak_flops = _validation.positive_number_or_one_of(
        peak_flops, "peak_flops", ("auto", "measure"), unit="FLOPs/sec of one replica"
    )
    if isinstance(peak_flops, float):
        return Peak(flops_per_sec=peak_flops, source="given"), None
    if peak_flops == "measure":
        return measure_matmul_flops_per_sec(device, compute_dtype), None
    details: dict[str, Any] = {}
    tf32_enabled = True
    if device_kind == "GPU":
        import tensorflow as tf

        with contextlib.suppress(IndexError, ValueError, RuntimeError):
            index = tf.DeviceSpec.from_string(device or "").device_index or 0
            gpu = tf.config.list_physical_devices("GPU")[index]
            details = tf.config.experimental.get_device_details(gpu)
        tf32_enabled = tf.config.experimental.tensor_float_32_execution_enabled()
    key = device_key(device_kind, details)
    fix = "MFU needs peak_flops=<FLOP/s of one replica>"
    if key is None:
        name = details.get("device_name") or device_kind
        fix += " or peak_flops='measure'" if device_kind == "CPU" else ""
        return None, f"the peak FLOP/s of {name} is not in keras_scaling's table; {fix}"
    capability = details.get("compute_capability")
    peak = lookup(key, compute_dtype, compute_capability=capability, tf32_enabled=tf32_enabled)
    if peak is None:
        return None, f"the table has no {compute_dtype} peak FLOP/s of {key}; {fix}"
    return peak, None
