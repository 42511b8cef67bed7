"""Reading the installed Keras' source and version (no tensor, device or strategy is created)."""

import inspect
import re

import keras

# The newest Keras release in which every defect was reproduced.
LAST_VERIFIED_KERAS = "3.16.0.dev2026102704"
TRAINER_NOT_FOUND = "Keras' TensorFlow trainer class was not found where this fix expects it"


def source_of(obj):
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None


def contains(pattern, source):
    return re.search(pattern, source) is not None


def keras_version():
    return keras.__version__


def by_version(defect, upstream_issue_open=True):
    """Without readable source, a Keras 3 is assumed to have `defect` (none fixed up to `LAST_VERIFIED_KERAS`)."""
    major = int(keras_version().split(".")[0])
    if major != 3:
        return False, f"Keras {keras_version()} is not Keras 3; {defect} is a Keras 3 defect"
    issue = ", upstream issue open" if upstream_issue_open else ""
    return True, (
        f"source not readable; Keras {keras_version()} is assumed to have "
        f"{defect} (reproduced up to {LAST_VERIFIED_KERAS}{issue})"
    )
