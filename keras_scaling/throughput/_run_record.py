"""The run record `log_dir/throughput.json` (docs/reference/throughput-json.md), handled here only."""

import contextlib
import dataclasses
import json
import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from keras_scaling.throughput import arithmetic as throughput_lib

THROUGHPUT_JSON = "throughput.json"
VERSION = 1  # the record's "version"
# Every key of a record, in the order written.
FIELDS = tuple(
    """version samples_per_sec steps_per_sec step_time_s num_replicas num_workers
    per_replica_batch_size global_batch_size device_kind dtype_policy strategy
    baseline_samples_per_sec baseline_source baseline_num_replicas speedup ideal_speedup
    efficiency steps_measured startup_time_s epochs flops_per_sample flops_source
    peak_flops_per_replica peak_source mfu""".split()
)
# Keys added to version 1 later: older files lack them, and read as null.
_LATER_FIELDS = ("baseline_num_replicas", "ideal_speedup", "epochs", *FIELDS[-5:])


def build_record(
    setup: Mapping[str, Any],
    *,
    steady: "throughput_lib.SteadyState | None" = None,
    baseline_samples_per_sec: float | None = None,
    baseline_source: str | None = None,
    baseline_num_replicas: int | None = None,
    startup_time_s: float | None = None,
    epochs: "Sequence[tuple[int, throughput_lib.SteadyState]]" = (),
    flops: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A complete record (the keys of `FIELDS`) from a run's set-up dict and what was measured."""
    record = dict.fromkeys(FIELDS)
    record.update({key: setup[key] for key in FIELDS if key in setup})
    record.update(
        version=VERSION,
        step_time_s={"p10": None, "p50": None, "p90": None},
        steps_measured=0,
        startup_time_s=startup_time_s,
        baseline_samples_per_sec=baseline_samples_per_sec,
        baseline_source=baseline_source,
        baseline_num_replicas=baseline_num_replicas,
        epochs=[
            {
                "epoch": int(epoch),
                "samples_per_sec": state.samples_per_sec,
                "steps_measured": state.steps_measured,
            }
            for epoch, state in epochs
        ],
        **(flops or {}),
    )
    if steady is not None:
        record.update(
            samples_per_sec=steady.samples_per_sec,
            steps_per_sec=steady.steps_per_sec,
            step_time_s={f"p{q}": getattr(steady, f"step_time_p{q}_s") for q in ("10", "50", "90")},
            steps_measured=steady.steps_measured,
        )
    figures = speedup_of(record)
    record.update(dataclasses.asdict(figures) if figures is not None else {})
    return record


def speedup_of(
    record: Mapping[str, Any], baseline: Mapping[str, Any] | None = None
) -> "throughput_lib.Speedup | None":
    """Speedup, ideal speedup and efficiency of a run record over its baseline.

    Args:
        record: a `throughput.json` record.
        baseline: another run's record; None uses the record's own `baseline_*` fields.

    Returns:
        A `keras_scaling.throughput.Speedup`, or None when either figure is missing.

    Example:

    ```python
    from keras_scaling import baseline
    run = {"samples_per_sec": 1800.0, "num_replicas": 2,
           "baseline_samples_per_sec": 1000.0, "baseline_num_replicas": 1}
    baseline.speedup_of(run)   # Speedup(speedup=1.8, ideal_speedup=2.0, efficiency=0.9)
    ```
    """
    if baseline is None:
        baseline = {
            key: record.get(f"baseline_{key}") for key in ("samples_per_sec", "num_replicas")
        }
    samples_per_sec = record.get("samples_per_sec")
    baseline_samples_per_sec = baseline.get("samples_per_sec")
    if not (_is_positive(samples_per_sec) and _is_positive(baseline_samples_per_sec)):
        return None
    return throughput_lib.speedup(
        samples_per_sec,
        baseline_samples_per_sec,
        record["num_replicas"],
        baseline.get("num_replicas") or 1,
    )


def _is_positive(value: object) -> TypeGuard[float]:
    # mypy does not order numbers.Real (python/mypy#3186)
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0  # type: ignore[operator]


def validate_record(record: Mapping[str, Any], where: str = "record") -> dict[str, Any]:
    """`record` with exactly the keys of `FIELDS` (later keys null), or a ValueError naming `where`."""
    if not isinstance(record, dict) or record.get("version") != VERSION:
        raise ValueError(
            f"{where} is not a version-{VERSION} {THROUGHPUT_JSON} written by ThroughputLogger"
        )
    record = {**dict.fromkeys(_LATER_FIELDS), **record}
    missing = [key for key in FIELDS if key not in record]
    extra = [key for key in record if key not in FIELDS]
    if missing or extra:
        raise ValueError(
            f"{where} does not match version {VERSION} of {THROUGHPUT_JSON}: missing {missing}, unexpected {extra}"
        )
    return {key: record[key] for key in FIELDS}


def measured_samples_per_sec(record: Mapping[str, Any], where: str, remedy: str) -> float:
    """The record's `samples_per_sec`, or a ValueError saying the run measured nothing."""
    samples_per_sec = record["samples_per_sec"]
    if not _is_positive(samples_per_sec):
        raise ValueError(
            f"{where} holds no measured samples_per_sec (got {samples_per_sec!r}): {remedy}"
        )
    return float(samples_per_sec)


def write_throughput_json(log_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> str:
    """Writes `record` to `log_dir/throughput.json`, atomically (written beside, then renamed).

    Args:
        log_dir: the run's log directory.
        record: dict with the keys of `FIELDS` (later keys may be left out).

    Returns:
        The path written.

    Raises:
        ValueError: `record` lacks a key of `FIELDS` or has another key.
        OSError: the file could not be written; the previous one is left whole.

    Example:

    ```python
    from keras_scaling import baseline
    record = {**dict.fromkeys(baseline.FIELDS), "version": 1, "samples_per_sec": 1500.0, "num_replicas": 1}
    baseline.write_throughput_json(".", record)   # './throughput.json'
    ```
    """
    record = validate_record(record, where="the throughput record")
    path = os.path.join(os.fspath(log_dir), THROUGHPUT_JSON)
    temporary = f"{path}.tmp{os.getpid()}"
    try:
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(json.dumps(record, indent=2, sort_keys=False) + "\n")
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise OSError(
            error.errno,
            f"Could not write {THROUGHPUT_JSON} in {os.fspath(log_dir)} ({error.strerror}); the {THROUGHPUT_JSON} there, if any, is the last one written and intact.",
        ) from error
    return path


def read_throughput_json(path: str | os.PathLike[str], parameter: str = "path") -> dict[str, Any]:
    """Reads a run's `throughput.json`.

    Args:
        path: the file, or the run's `log_dir` that holds it.
        parameter: the argument name to use in error messages.

    Returns:
        The record, a dict with the keys of `FIELDS`.

    Raises:
        ValueError: the file is missing, not JSON, or not a version-1 throughput record.

    Example:

    ```python
    from keras_scaling import baseline
    record = {**dict.fromkeys(baseline.FIELDS), "version": 1, "samples_per_sec": 1500.0, "num_replicas": 1}
    baseline.write_throughput_json(".", record)
    baseline.read_throughput_json(".")["samples_per_sec"]   # 1500.0
    ```
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, THROUGHPUT_JSON)
    if not os.path.isfile(path):
        raise ValueError(
            f"{parameter}={path!r} does not exist; pass an earlier run's log_dir (holding {THROUGHPUT_JSON}) or the path of its {THROUGHPUT_JSON}"
        )
    try:
        with open(path, encoding="utf-8") as file:
            record = json.load(file)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{parameter}={path!r} cannot be read as JSON: {error}") from None
    return validate_record(record, where=f"{parameter}={path!r}")
