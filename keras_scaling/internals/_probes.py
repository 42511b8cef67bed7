"""Guarded reaches into private Keras and TensorFlow names.

A function wrapped by `guarded` reads private names and checks their shape,
nothing else. When a release moved or reshaped a name, it returns its
fallback ("unknown": None, nothing found) and one warning per process names
the Keras and TensorFlow versions, what is lost and the workaround. Only the
errors a moved name raises are caught (`REACH_ERRORS`); any other error is a
bug of keras_scaling's own and propagates, so it is never reported as "Keras
changed" and never turns a feature off.
"""

import functools
import logging
import os
import threading

logger = logging.getLogger("keras_scaling")

# Probes to fail as if their names were gone, comma-separated: most private
# names are used by TensorFlow itself and cannot be hidden in a test.
FAIL_PROBES_ENV = "KERAS_SCALING_FAIL_PROBES"


class ReachError(Exception):
    """A private name was found but is not of the shape a probe knows."""


# A missing attribute, module or key, a changed signature, a failed shape
# check. Not LookupError: an IndexError, like a ValueError, is a bug of ours.
REACH_ERRORS = (AttributeError, ImportError, KeyError, TypeError, ReachError)

_lock = threading.Lock()
_registry: dict[str, "Probe"] = {}
_warned: set[str] = set()


class Probe:
    """What one guarded reach needs and what is lost without it."""

    def __init__(self, name, reaches, lost, workaround):
        self.name, self.reaches, self.lost, self.workaround = name, reaches, lost, workaround

    def warn(self, error):
        """Logs, once per process, that this probe failed."""
        with _lock:
            if self.name in _warned:
                return
            _warned.add(self.name)
        from keras_scaling.internals import _versions

        versions = f"Keras {_versions.keras_version()}, TensorFlow {_versions.tf_version()}"
        logger.warning(
            f"keras_scaling: {self.reaches} is not usable with {versions} "
            f"({type(error).__name__}: {error}). Lost: {self.lost}. {self.workaround}"
        )


def guarded(name, *, reaches, lost, workaround, fallback=None):
    """Wraps a function that reads private names: a moved name gives `fallback`.

    Args:
        name: the probe's name, such as `"keras.layer.flatten_layers"`.
        reaches: the private name(s) it reads, for the warning.
        lost: what keras_scaling cannot do when the probe fails.
        workaround: what the user can do instead.
        fallback: the value returned when the probe fails, or a callable
            called with the same arguments to compute it.
    """
    probe = Probe(name, reaches, lost, workaround)
    with _lock:
        _registry[name] = probe

    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            try:
                if name in os.environ.get(FAIL_PROBES_ENV, "").replace(" ", "").split(","):
                    raise AttributeError(f"{reaches} made unreachable by {FAIL_PROBES_ENV}")
                return function(*args, **kwargs)
            except REACH_ERRORS as error:
                probe.warn(error)
                return fallback(*args, **kwargs) if callable(fallback) else fallback

        wrapper.probe = probe  # type: ignore[attr-defined]
        return wrapper

    return decorate


def failed(name, error):
    """Reports a failure of the probe `name` found outside a guarded function."""
    _registry[name].warn(error)
