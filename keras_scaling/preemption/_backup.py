"""The backup file of `BackupAndRestore`: format, atomic writes, validation.

Pure core: plain values in, plain values out. A backup is one file,
`backup_dir/backup.npz`, holding the raw bytes of every variable (so a restore
is bitwise) and a JSON header with the variables' paths, shapes and dtypes,
the data plan and the position in training. It is written to a temporary
file in the same directory, flushed to disk and renamed over the previous
one, so a process killed during a save leaves the previous backup whole.
"""

import dataclasses
import json
import os
import tempfile
import time
import zipfile

import numpy as np

# EX_TEMPFAIL of sysexits.h: "a temporary failure; the user is invited to
# retry". Distinct from success (0), errors (1, 2) and death by a signal
# (128 + N), so a scheduler or `keras-scaling launch --max-restarts` knows that
# the job saved a backup and can run again.
EXIT_PREEMPTED = 75

FILE_NAME = "backup.npz"
FORMAT = "keras_scaling.backup"
FORMAT_VERSION = 1
_TEMP_PREFIX = ".backup-"
_HEADER_KEY = "header"

# Fields of an `InputPlan` that decide which samples each step reads; the
# worker index and the wording of the reasons do not.
PLAN_FIELDS = (
    "num_examples",
    "num_replicas",
    "num_workers",
    "global_batch_size",
    "steps_per_epoch",
    "last_batch",
    "shard_mode",
    "shuffle",
    "seed",
    "num_files",
)


class BackupError(ValueError):
    """A backup that cannot be restored into this model or data, or is unreadable."""


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training stands when a backup is written.

    Args:
        epoch: int, the epoch in progress (0-based).
        step_in_epoch: int, optimizer steps already trained in that epoch.
        iterations: int, the optimizer's `iterations`.
        data_pass: int or None, the number of the pass over the training
            data (of `keras_scaling.data.distribute`) that `epoch` reads, which
            fixes its order, or None when the data is of another kind.
    """

    epoch: int
    step_in_epoch: int
    iterations: int
    data_pass: int | None = None


def variable_spec(path, shape, dtype):
    """The identity of one variable in a backup: `{"path", "shape", "dtype"}`."""
    return {"path": str(path), "shape": [int(size) for size in shape], "dtype": str(dtype)}


def plan_summary(plan):
    """The fields of an `InputPlan` that a resume must see unchanged, or None."""
    if plan is None:
        return None
    return {field: getattr(plan, field) for field in PLAN_FIELDS}


def backup_path(backup_dir):
    """The backup file in `backup_dir`."""
    return os.path.join(os.fspath(backup_dir), FILE_NAME)


def write(backup_dir, *, values, specs, header):
    """Writes a backup atomically; the previous one stays whole until the rename.

    Args:
        backup_dir: str, the directory (created when missing).
        values: list of NumPy arrays, in the order of `specs`.
        specs: list of `variable_spec` dicts.
        header: dict, JSON-serializable: position, plan and anything else.

    Returns:
        str, the path written.

    Raises:
        OSError: the write failed (a full disk, a read-only directory): the
            message names the directory; the previous backup is intact.
    """
    backup_dir = os.fspath(backup_dir)
    os.makedirs(backup_dir, exist_ok=True)
    if len(values) != len(specs):
        raise ValueError(
            f"values and specs must have the same length, got {len(values)} and {len(specs)}"
        )
    full_header = dict(header)
    full_header.update(format=FORMAT, version=FORMAT_VERSION, variables=specs, saved_at=time.time())
    arrays = {
        f"v{index}": np.frombuffer(np.ascontiguousarray(value).tobytes(), np.uint8)
        for index, value in enumerate(values)
    }
    arrays[_HEADER_KEY] = np.frombuffer(json.dumps(full_header).encode("utf-8"), np.uint8)
    descriptor, temp_path = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=".tmp", dir=backup_dir)
    try:
        # mkstemp makes the file private; a backup gets the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp_path, 0o666 & ~umask)
        with os.fdopen(descriptor, "wb") as file:
            np.savez(file, **arrays)  # type: ignore[arg-type]  # numpy types **kwds as allow_pickle
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp_path, backup_path(backup_dir))
    except OSError as error:
        _remove_quietly(temp_path)
        raise OSError(
            error.errno,
            f"Could not save a backup in {backup_dir} ({error.strerror}). The previous "
            f"backup there, if any, is intact: free space (or point backup_dir to "
            "another directory) and run the same script again to resume from it.",
        ) from error
    except BaseException:
        _remove_quietly(temp_path)
        raise
    _fsync_directory(backup_dir)
    return backup_path(backup_dir)


def exists(backup_dir):
    """Whether `backup_dir` holds a backup file."""
    return os.path.isfile(backup_path(backup_dir))


def read(backup_dir):
    """Reads a backup: `(header, raw_values)`, or None when there is none.

    `raw_values` are uint8 arrays of each variable's bytes; `decode` turns
    one into an array of the variable's dtype and shape.

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
            f"The backup {path} is corrupt or not a keras_scaling backup "
            f"({type(error).__name__}: {error}). Nothing was overwritten. Delete "
            "the file to start training from the beginning, or point backup_dir "
            "to another directory."
        ) from None
    if header.get("format") != FORMAT or header.get("version") != FORMAT_VERSION:
        raise BackupError(
            f"The backup {path} has format {header.get('format')!r} version "
            f"{header.get('version')!r}; this keras_scaling reads {FORMAT!r} "
            f"version {FORMAT_VERSION}. Nothing was overwritten."
        )
    return header, raw_values


def decode(raw, spec, numpy_dtype):
    """One variable's value from its bytes in a backup."""
    return np.frombuffer(raw.tobytes(), dtype=numpy_dtype).reshape(spec["shape"])


def variable_differences(saved_specs, current_specs, limit=5):
    """How two lists of variables differ, in order: a list of short sentences.

    Variables are matched by position, as they are created; a path that
    differs alone is not a difference (Keras numbers layer names per
    process), a shape or dtype is.

    For example, a saved `[dense/kernel (8, 4) float32]` against a current
    `[dense/kernel (8, 5) float32]` gives
    `["variable 0 (dense/kernel): shape [8, 4] in the backup, [8, 5] here"]`.
    """
    differences = []
    if len(saved_specs) != len(current_specs):
        differences.append(f"{len(saved_specs)} variables in the backup, {len(current_specs)} here")
    for index, (saved, current) in enumerate(zip(saved_specs, current_specs)):
        for key in ("shape", "dtype"):
            if saved[key] != current[key]:
                differences.append(
                    f"variable {index} ({current['path']}): {key} {saved[key]} in "
                    f"the backup, {current[key]} here"
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
        + ". Nothing was overwritten. Resume with the same model and data, or "
        "point backup_dir to a new directory (or delete the backup) to start over."
    )


def save_is_due(iterations, last_saved_iterations, every_n_steps):
    """Whether a multiple of `every_n_steps` was passed since the last save.

    Counted on the optimizer's `iterations`, so it is right with
    `steps_per_execution > 1` (one batch end per several steps) and across
    resumes: with `every_n_steps=100`, a save is due at the first batch end
    at or after 100, 200, ...
    """
    if not every_n_steps:
        return False
    return iterations // every_n_steps > last_saved_iterations // every_n_steps


def remove(backup_dir):
    """Removes the backup file and any temporary file a killed save left."""
    backup_dir = os.fspath(backup_dir)
    _remove_quietly(backup_path(backup_dir))
    remove_temporary_files(backup_dir)


def remove_temporary_files(backup_dir):
    """Removes the temporary files of saves that were killed."""
    try:
        names = os.listdir(backup_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(_TEMP_PREFIX) and name.endswith(".tmp"):
            _remove_quietly(os.path.join(backup_dir, name))


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass


def _fsync_directory(path):
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
