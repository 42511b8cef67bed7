"""The installed Keras and TensorFlow, read without importing them, and the supported range."""

import functools
import importlib.metadata
import importlib.util
import os
import re

# The oldest releases the version matrix tests (`make test-versions`).
MIN_KERAS = (3, 8)
MIN_TENSORFLOW = (2, 18)
TESTED_PAIRS = (
    ("2.18.1", "3.8.0"),
    ("2.19.1", "3.10.0"),
    ("2.20.0", "3.12.4"),
    ("2.21.0", "3.15.1"),
    ("2.21.0", "3.16.0.dev2026102704"),
)
# Distributions that install the `tensorflow` package.
_TENSORFLOW_DISTRIBUTIONS = tuple(
    "tensorflow tensorflow-cpu tf-nightly tf-nightly-cpu tensorflow-gpu tensorflow-intel "
    "tensorflow-macos tensorflow-aarch64".split()
)
_KERAS_DISTRIBUTIONS = ("keras", "keras-nightly")


def keras_at_least(*release):
    """Whether the installed Keras is `release` or newer: `keras_at_least(3, 10)`."""
    return parse(keras_version()) >= release


def parse(version):
    """The leading release numbers of a version string: `"3.16.0.dev1"` -> (3, 16, 0)."""
    numbers = re.match(r"\d+(\.\d+)*", version or "")
    return () if numbers is None else tuple(map(int, numbers.group(0).split(".")))


def _package_dir(package):
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    locations = spec and spec.submodule_search_locations
    return list(locations)[0] if locations else None


@functools.cache
def keras_version():
    """The version of the `keras` that `import keras` loads (right with `keras-nightly` beside it), or None."""
    directory = _package_dir("keras")
    if directory is None:
        return None
    try:
        with open(os.path.join(directory, "src", "version.py"), encoding="utf-8") as file:
            found = re.search(r"__version__\s*=\s*[\"']([^\"']+)[\"']", file.read())
        return found.group(1) if found else _distribution_version(_KERAS_DISTRIBUTIONS)
    except OSError:
        return _distribution_version(_KERAS_DISTRIBUTIONS)


@functools.cache
def tf_version():
    """The version of the installed TensorFlow, or None when it is not installed."""
    if _package_dir("tensorflow") is None:
        return None
    return _distribution_version(_TENSORFLOW_DISTRIBUTIONS) or "unknown"


def _distribution_version(names):
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def unsupported_reason(keras, tensorflow):
    """Why a Keras/TensorFlow pair (version strings, None when missing) cannot run, or None."""
    keras_min, tf_min = ".".join(map(str, MIN_KERAS)), ".".join(map(str, MIN_TENSORFLOW))
    supported = f"keras_scaling supports Keras {keras_min} or newer (Keras 3) with TensorFlow {tf_min} or newer"
    if tensorflow is None:
        # An extra, so that pip never adds `tensorflow` beside an installed tensorflow-cpu or tf-nightly.
        return f"TensorFlow is not installed. {supported}: `pip install 'keras-scaling[tensorflow]'` (or `'keras-scaling[tensorflow-cpu]'`), or install the TensorFlow build you want (tensorflow-cpu, tf-nightly, ...)."
    if keras is None:
        return f"Keras is not installed. {supported}: `pip install 'keras>=3.8'`."
    keras_release, tf_release = parse(keras), parse(tensorflow)
    if keras_release[:1] != (3,) or keras_release[:2] < MIN_KERAS:
        return f"Keras {keras} is installed. {supported}: `pip install --upgrade 'keras>=3.8,<4'`."
    if tf_release and tf_release[:2] < MIN_TENSORFLOW:
        return f"TensorFlow {tensorflow} is installed. {supported}: `pip install --upgrade 'tensorflow>=2.18'`."
    return None


def check_supported():
    """Raises `ImportError` when the installed Keras or TensorFlow is unsupported."""
    reason = unsupported_reason(keras_version(), tf_version())
    if reason is not None:
        raise ImportError(reason)
