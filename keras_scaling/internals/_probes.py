"""Guarded reaches into private Keras and TensorFlow names.

Keras and TensorFlow move their internals between releases. Every function
that reads a private name is wrapped by `guarded`: when the name is gone or
has another shape, the function returns a fallback instead of raising, and
one warning says which Keras and TensorFlow versions are installed, what
keras_scaling loses there and what the user can do instead.

A guarded function is the reach and nothing else: it reads the private names
and checks their shape; the logic that uses what it read lives outside it.
`guarded` catches only what a moved or reshaped name raises (`REACH_ERRORS`:
a missing attribute or module, a changed signature, a missing key, or
`ReachError` from a shape check). Any other exception is a bug of
keras_scaling's own and propagates: it is never reported as "Keras changed"
and never turns a feature off. A figure that cannot be computed is left out, never guessed: the
fallbacks are "unknown" values (`None`, nothing found) that the callers
already handle.

Each probe has a name, so that `KERAS_SCALING_FAIL_PROBES` can make it
fail as if the name it reaches for were gone.
"""

import functools
import logging
import os
import threading

logger = logging.getLogger("keras_scaling")

# Names of probes to fail as if their internals were gone, comma-separated:
# tests use it for internals that TensorFlow itself needs, which cannot be
# hidden without breaking TensorFlow.
FAIL_PROBES_ENV = "KERAS_SCALING_FAIL_PROBES"


class ReachError(Exception):
    """A private name was found but is not of the shape a probe knows."""


# What a reach raises when a release moved or reshaped the name it reads.
REACH_ERRORS = (AttributeError, ImportError, TypeError, LookupError, ReachError)

_lock = threading.Lock()
_registry: dict[str, "Probe"] = {}
_warned: set[str] = set()


class Probe:
    """What one guarded reach needs and what is lost without it."""

    def __init__(self, name, reaches, lost, workaround):
        self.name = name
        self.reaches = reaches
        self.lost = lost
        self.workaround = workaround

    def warn(self, error):
        """Logs, once per process, that this probe failed."""
        with _lock:
            if self.name in _warned:
                return
            _warned.add(self.name)
        logger.warning(
            "keras_scaling: %s is not usable with %s (%s: %s). Lost: %s. %s",
            self.reaches,
            versions_text(),
            type(error).__name__,
            error,
            self.lost,
            self.workaround,
        )


def versions_text():
    """ "Keras X, TensorFlow Y" for messages, read without failing."""
    from keras_scaling.internals import _versions

    return f"Keras {_versions.keras_version()}, TensorFlow {_versions.tf_version()}"


def guarded(name, *, reaches, lost, workaround, fallback=None):
    """Wraps a function that reads private names; a moved name does not raise.

    Only `REACH_ERRORS` are caught; any other exception propagates.

    Args:
        name: the probe's name, such as `"keras.model.flatten_layers"`.
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
                if name in _failing_for_tests():
                    raise AttributeError(f"{reaches} made unreachable by {FAIL_PROBES_ENV}")
                return function(*args, **kwargs)
            except REACH_ERRORS as error:  # a moved or reshaped internal
                probe.warn(error)
                if callable(fallback):
                    return fallback(*args, **kwargs)
                return fallback

        wrapper.probe = probe  # type: ignore[attr-defined]
        return wrapper

    return decorate


def _failing_for_tests():
    value = os.environ.get(FAIL_PROBES_ENV)
    return () if not value else {part.strip() for part in value.split(",")}


def failed(name, error):
    """Reports a failure of the probe `name` found outside a guarded function."""
    _registry[name].warn(error)
