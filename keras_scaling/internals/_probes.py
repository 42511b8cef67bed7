"""Guarded reaches into private names: a moved name gives the fallback and one warning per process.

Only the errors a moved name raises are caught (`REACH_ERRORS`); any other error is
keras_scaling's own bug and propagates, never reported as "Keras changed".
"""

import functools
import logging
import os
import threading

logger = logging.getLogger("keras_scaling")

# Probes to fail as if their names were gone: most are used by TensorFlow itself, so a test cannot hide them.
FAIL_PROBES_ENV = "KERAS_SCALING_FAIL_PROBES"


class ReachError(Exception):
    """A private name was found but is not of the shape a probe knows."""


# Not LookupError: an IndexError, like a ValueError, is a bug of ours.
REACH_ERRORS = (AttributeError, ImportError, KeyError, TypeError, ReachError)

_lock = threading.Lock()
_registry: dict[str, "Probe"] = {}
_warned: set[str] = set()


class Probe:
    """What one guarded reach reads, and what is lost without it."""

    def __init__(self, name, reaches, lost, workaround):
        self.name, self.reaches, self.lost, self.workaround = name, reaches, lost, workaround

    def warn(self, error):
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
    """Wraps a reach named `name`: a moved name gives `fallback` (a value, or a callable of the same arguments)."""
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
