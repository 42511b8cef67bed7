"""Reading the installed Keras to decide whether a fix applies.

Each fix's probe (guarded by `keras_scaling.internals._probes`) reads only
source code, attributes and versions with these: it creates no
tensor, device or strategy, so it is safe before `use_logical_cpus` and
cannot set up collectives that would clash with the user's strategy.
"""

import inspect
import re

import keras

# The newest Keras release in which every defect was reproduced.
LAST_VERIFIED_KERAS = "3.16.0.dev2026102704"
TRAINER_NOT_FOUND = "Keras' TensorFlow trainer class was not found where this fix expects it"


def source_of(obj):
    """Returns the source code of `obj`, or None when it is not available."""
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None


def contains(pattern, source):
    """Whether the regular expression `pattern` occurs in `source`."""
    return re.search(pattern, source) is not None


def keras_version():
    """The installed Keras version as a string, such as `"3.15.1"`."""
    return keras.__version__


def by_version(defect, upstream_issue_open=True):
    """Decides by version when the source cannot be read.

    No Keras 3 release fixes these defects up to `LAST_VERIFIED_KERAS`: a
    Keras 3 without readable source is assumed to still have `defect`.
    """
    major = int(keras_version().split(".")[0])
    if major != 3:
        return False, f"Keras {keras_version()} is not Keras 3; {defect} is a Keras 3 defect"
    issue = ", upstream issue open" if upstream_issue_open else ""
    return True, (
        f"source not readable; Keras {keras_version()} is assumed to have "
        f"{defect} (reproduced up to {LAST_VERIFIED_KERAS}{issue})"
    )
