"""The backup file of `BackupAndRestore`: every variable's raw bytes and a JSON header."""

import contextlib
import dataclasses
import json
import os
import tempfile
import time
import zipfile

import numpy as np

# EX_TEMPFAIL of sysexits.h ("try again"): distinct from success, errors and
# signals, so a scheduler or `launch --max-restarts` knows the job can resume.
EXIT_PREEMPTED = 75

FILE_NAME = "backup.npz"
FORMAT = "keras_scaling.backup"
FORMAT_VERSION = 1
_TEMP_PREFIX = ".backup-"
_HEADER_KEY = "header"

# The fields of an `InputPlan` that decide which samples each step reads.
PLAN_FIELDS = tuple(
    "num_examples num_replicas num_workers global_batch_size steps_per_epoch "
    "last_batch shard_mode shuffle seed num_files".split()
)


class BackupError(ValueError):
    """A backup of another model or data plan, or an unreadable one."""


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training stands: `epoch` (0-based), the steps trained in it, the optimizer's
    `iterations`, and the `distribute` data's pass number (its order) or None."""

    epoch: int
    step_in_epoch: int
    iterations: int
    data_pass: int | None = None


def variable_spec(path, shape, dtype):
    """The identity of one variable in a backup: `{"path", "shape", "dtype"}`."""
    return {"path": str(path), "shape": [int(size) for size in shape], "dtype": str(dtype)}


def plan_summary(plan):
    """The fields of an `InputPlan` that a resume must see unchanged, or None."""
    return None if plan is None else {field: getattr(plan, field) for field in PLAN_FIELDS}


def backup_path(backup_dir):
    return os.path.join(os.fspath(backup_dir), FILE_NAME)


def write(backup_dir, *, values, specs, header):
    """Writes a backup atomically (a temporary file beside it, flushed and renamed over it).

    Raises:
        OSError: naming the directory (a full disk); the previous backup is intact.
    """
    backup_dir = os.fspath(backup_dir)
    os.makedirs(backup_dir, exist_ok=True)
    full_header = {**header, "format": FORMAT, "version": FORMAT_VERSION, "variables": specs}
    full_header["saved_at"] = time.time()
    arrays = {
        f"v{index}": np.frombuffer(np.ascontiguousarray(value).tobytes(), np.uint8)
        for index, value in enumerate(values)
    }
    arrays[_HEADER_KEY] = np.frombuffer(json.dumps(full_header).encode("utf-8"), np.uint8)
    descriptor, temp_path = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=".tmp", dir=backup_dir)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp_path, 0o666 & ~umask)  # mkstemp's 0o600 would hide it from other users
        with os.fdopen(descriptor, "wb") as file:
            np.savez(file, **arrays)  # type: ignore[arg-type]  # numpy types **kwds as allow_pickle
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp_path, backup_path(backup_dir))
    except BaseException as error:
        _remove_quietly(temp_path)
        if not isinstance(error, OSError):
            raise
        intact = "the previous one is intact: free space and run the script again to resume from it"
        raise OSError(
            error.errno, f"Could not save a backup in {backup_dir} ({error.strerror}); {intact}."
        ) from error
    with contextlib.suppress(OSError):  # the rename survives a power cut
        descriptor = os.open(backup_dir, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    return backup_path(backup_dir)


def read(backup_dir):
    """`(header, raw_values)` (uint8 arrays, see `decode`), or None without a backup.

    Raises:
        BackupError: the file is not a readable backup of this format.
    """
    path = backup_path(backup_dir)
    if not os.path.isfile(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as archive:
            header = json.loads(bytes(archive[_HEADER_KEY]).decode("utf-8"))
            count = len(header["variables"])
            raw_values = [np.array(archive[f"v{index}"]) for index in range(count)]
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as error:
        raise BackupError(
            f"The backup {path} is corrupt ({type(error).__name__}: {error}); nothing "
            "was overwritten. Delete it to start from the beginning."
        ) from None
    if header.get("format") != FORMAT or header.get("version") != FORMAT_VERSION:
        raise BackupError(
            f"The backup {path} has format {header.get('format')!r} version {header.get('version')!r}, not {FORMAT!r} version {FORMAT_VERSION}: delete it"
        )
    return header, raw_values


def decode(raw, spec, numpy_dtype):
    return np.frombuffer(raw.tobytes(), dtype=numpy_dtype).reshape(spec["shape"])


def variable_differences(saved_specs, current_specs, limit=5):
    """How two lists of variables differ by position, in short sentences: shapes and dtypes, not
    paths (Keras numbers layer names per process)."""
    differences = []
    if len(saved_specs) != len(current_specs):
        differences.append(f"{len(saved_specs)} variables in the backup, {len(current_specs)} here")
    for index, (saved, current) in enumerate(zip(saved_specs, current_specs)):
        for key in ("shape", "dtype"):
            if saved[key] != current[key]:
                where = f"variable {index} ({current['path']})"
                differences.append(
                    f"{where}: {key} {saved[key]} in the backup, {current[key]} here"
                )
    if len(differences) > limit:
        differences = differences[:limit] + [f"and {len(differences) - limit} more"]
    return differences


def plan_differences(saved_plan, current_plan):
    """How two `plan_summary` dicts differ: a list of short sentences."""
    if saved_plan is None or current_plan is None:
        return []
    return [
        f"{field} {saved_plan.get(field)!r} in the backup, {current_plan.get(field)!r} here"
        for field in PLAN_FIELDS
        if saved_plan.get(field) != current_plan.get(field)
    ]


def mismatch_error(backup_dir, what, differences):
    """The `BackupError` for a backup of another model or data plan."""
    return BackupError(
        f"The backup in {os.fspath(backup_dir)} was written for another {what}: "
        + "; ".join(differences)
        + ". Nothing was overwritten: resume with the same model and data, or delete it."
    )


def save_is_due(iterations, last_saved_iterations, every_n_steps):
    """Whether a multiple of `every_n_steps` was passed since the last save."""
    if not every_n_steps:
        return False
    return iterations // every_n_steps > last_saved_iterations // every_n_steps


def remove(backup_dir):
    """Removes the backup file and any temporary file a killed save left."""
    _remove_quietly(backup_path(backup_dir))
    remove_temporary_files(backup_dir)


def remove_temporary_files(backup_dir):
    with contextlib.suppress(OSError):
        for name in os.listdir(backup_dir):
            if name.startswith(_TEMP_PREFIX) and name.endswith(".tmp"):
                _remove_quietly(os.path.join(backup_dir, name))


def _remove_quietly(path):
    with contextlib.suppress(OSError):
        os.remove(path)
