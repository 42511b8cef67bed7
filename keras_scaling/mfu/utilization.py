"""Model TFLOP/s and MFU (model FLOPs utilization) from throughput: plain arithmetic."""

import dataclasses
from collections.abc import Sequence

from keras_scaling import _validation

__all__ = [
    "Utilization",
    "check_flops_per_sample",
    "check_peak_flops",
    "underuse_advice",
    "utilization",
]

# Efficiency at or above this is "scales well"; MFU below LOW_MFU is "underused".
HIGH_EFFICIENCY, LOW_MFU = 0.8, 0.2


@dataclasses.dataclass(frozen=True)
class Utilization:
    """Achieved model FLOPs, and their share of the peak.

    Args:
        tflops_per_sec: float, model TFLOP/s of all replicas together.
        tflops_per_sec_per_replica: float, `tflops_per_sec / num_replicas`.
        mfu: float, achieved FLOPs/sec over the peak of all replicas, or None.

    Example:

    ```python
    figures = utilization(3.2e6, 10_000.0, num_replicas=2, peak_flops_per_replica=1e11)
    figures.tflops_per_sec, figures.mfu   # (0.032, 0.16)
    ```
    """

    tflops_per_sec: float
    tflops_per_sec_per_replica: float
    mfu: float | None = None


def utilization(
    flops_per_sample: float,
    samples_per_sec: float,
    num_replicas: int,
    peak_flops_per_replica: float | None = None,
) -> Utilization:
    """Model TFLOP/s and MFU of a throughput figure.

    Args:
        flops_per_sample: float, operations of one training sample, forward and backward.
        samples_per_sec: float, samples trained per second, all replicas.
        num_replicas: int, replicas in sync.
        peak_flops_per_replica: float, peak FLOPs/sec of one replica, or None (no MFU).

    Returns:
        A `Utilization`.

    Raises:
        TypeError, ValueError: a figure that is not a positive, finite number.

    Example:

    ```python
    utilization(3.2e6, 10_000.0, 2, 1e11).mfu   # 0.16
    ```
    """
    flops_per_sample = _validation.positive_number(flops_per_sample, "flops_per_sample")
    flops_per_sec = flops_per_sample * _validation.positive_number(
        samples_per_sec, "samples_per_sec"
    )
    num_replicas = _validation.positive_int(num_replicas, "num_replicas")
    mfu = None
    if peak_flops_per_replica is not None:
        peak = _validation.positive_number(peak_flops_per_replica, "peak_flops_per_replica")
        mfu = flops_per_sec / (peak * num_replicas)
    return Utilization(flops_per_sec / 1e12, flops_per_sec / 1e12 / num_replicas, mfu)


def check_flops_per_sample(
    value: float | str | None, parameter: str = "flops_per_sample"
) -> float | str | None:
    """Checks a `flops_per_sample` argument: `"auto"`, None or a positive number.

    Args:
        value: the argument.
        parameter: its name in error messages.

    Returns:
        The value, a number as float.

    Raises:
        TypeError, ValueError: anything else, saying what is allowed.

    Example:

    ```python
    check_flops_per_sample(3.2e6)   # 3200000.0
    ```
    """
    return _validation.positive_number_or_one_of(
        value, parameter, ("auto", None), unit="floating-point operations of one sample"
    )


def check_peak_flops(
    value: float | str | None, parameter: str = "peak_flops"
) -> float | str | None:
    """Checks a `peak_flops` argument: `"auto"`, `"measure"`, None or a positive number.

    Args:
        value: the argument.
        parameter: its name in error messages.

    Returns:
        The value, a number as float.

    Raises:
        TypeError, ValueError: anything else, saying what is allowed.

    Example:

    ```python
    check_peak_flops("measure")   # 'measure'
    ```
    """
    return _validation.positive_number_or_one_of(
        value, parameter, ("auto", "measure", None), unit="FLOPs/sec of one replica"
    )


def underuse_advice(
    *,
    efficiency: float | None,
    mfu: float | None,
    per_replica_batch_size: int,
    compute_dtype: str,
    faster_dtypes: Sequence[tuple[str, float]] = (),
    input_samples_per_sec: float | None = None,
    samples_per_sec: float | None = None,
) -> str | None:
    """What keeps devices underused when training scales well (efficiency >= 0.8, MFU < 0.2).

    In this order: an input pipeline barely faster than training; float32 on a device with
    faster dtypes; a small per-replica batch.

    Args:
        efficiency: float, scaling efficiency, or None.
        mfu: float, or None.
        per_replica_batch_size: int.
        compute_dtype: str, the dtype policy's compute dtype.
        faster_dtypes: `(dtype, times faster)` pairs the device offers.
        input_samples_per_sec: float, the input pipeline alone, or None.
        samples_per_sec: float, training's throughput, or None.

    Returns:
        str, one piece of advice, or None.

    Example:

    ```python
    underuse_advice(efficiency=0.95, mfu=0.05, per_replica_batch_size=16,
                    compute_dtype="float32")
    # 'MFU is 0.05 although scaling efficiency is 0.95: ... per-replica batch of 16 ...'
    ```
    """
    if efficiency is None or mfu is None or efficiency < HIGH_EFFICIENCY or mfu >= LOW_MFU:
        return None
    opening = f"MFU is {mfu:.2f} although scaling efficiency is {efficiency:.2f}: every replica is underused alike."
    if input_samples_per_sec is not None and samples_per_sec is not None:
        if input_samples_per_sec < 1.2 * samples_per_sec:
            return f"{opening} The input pipeline alone yields {input_samples_per_sec:.0f} samples/sec, barely more than training takes ({samples_per_sec:.0f}): the devices wait for input (more parallel reads and maps, prefetch, cache)."
    if compute_dtype == "float32" and faster_dtypes:
        dtype, times = faster_dtypes[0]
        policy = "mixed_bfloat16" if dtype == "bfloat16" else "mixed_float16"
        return f"{opening} The device peaks {times:.0f}x higher in {dtype} than in float32: keras.mixed_precision.set_global_policy({policy!r})."
    batch = per_replica_batch_size
    return f"{opening} A per-replica batch of {batch} gives each device little work per step: try a larger per-replica batch (keras-scaling bench --per-replica-batch {batch},{batch * 2},{batch * 4} finds the smallest that keeps devices busy)."
