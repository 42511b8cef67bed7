"""Fixes for Keras 3 defects of `model.fit` under `tf.distribute`, each replacing one function of
Keras (its TensorFlow trainer's, or LossScaleOptimizer's) when the installed Keras has the defect.
"""

import dataclasses
import logging
import os
import threading
from typing import TYPE_CHECKING

from keras_scaling.compat import (
    _keras_source,
    _keras_trainer,
    _loss_scale_finite,
    _multi_worker_epoch,
    _scalar_reduce,
    _steps_per_execution,
    _symbolic_build,
)
from keras_scaling.devices import _topology
from keras_scaling.internals import _probes, _versions

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

__all__ = [
    "CompatStatus",
    "FixStatus",
    "NO_COMPAT_ENV",
    "disable",
    "enable",
    "enable_for",
    "status",
]

logger = logging.getLogger("keras_scaling")

NO_COMPAT_ENV = "KERAS_SCALING_NO_COMPAT"

_FIXES = (
    _steps_per_execution,
    _symbolic_build,
    _scalar_reduce,
    _multi_worker_epoch,
    _loss_scale_finite,
)
_FIX_NAMES = tuple(fix.NAME for fix in _FIXES)
_lock = threading.RLock()
# name -> (owner, attribute, original, replacement)
_active: dict[str, tuple] = {}
# Fixes turned off by `disable()`: automatic enabling leaves them off.
_disabled_by_user: set[str] = set()
_probe_results: dict[str, tuple[bool, str | None]] = {}
_env_notice_logged = False


def _guard_probe(fix):
    return _probes.guarded(
        f"compat.{fix.NAME}",
        reaches=f"the Keras code behind {fix.ISSUE} (the {fix.NAME} fix)",
        lost=f"the {fix.NAME} fix stays off ({fix.SUMMARY})",
        workaround="See keras_scaling.compat.status() and 'Supported versions' in the README.",
        fallback=(False, "the installed Keras could not be read (see the warning)"),
    )(fix.probe)


_GUARDED_PROBES = {fix.NAME: _guard_probe(fix) for fix in _FIXES}


@dataclasses.dataclass(frozen=True)
class FixStatus:
    """One fix: what it repairs, whether this Keras needs it and whether it is on.

    Args:
        name: the fix's name, such as `"steps_per_execution"`.
        issue: the upstream issue, such as `"keras-team/keras#19246"`.
        summary: the defect and the fix, in one sentence.
        needed: whether the installed Keras has the defect.
        active: whether the fix is applied now.
        why: why it is needed or not, and active or not.

    Example:

    ```python
    fix = keras_scaling.compat.status()["steps_per_execution"]
    print(fix.issue, fix.needed, fix.active, fix.why)
    ```
    """

    name: str
    issue: str
    summary: str
    needed: bool
    active: bool
    why: str


@dataclasses.dataclass(frozen=True)
class CompatStatus:
    """Every fix of `keras_scaling.compat` and its state; `str()` is a table.

    Args:
        fixes: a `FixStatus` per fix.
        keras_version: the installed Keras version.
        disabled_by_env: whether `KERAS_SCALING_NO_COMPAT=1` turns them off.

    Example:

    ```python
    print(keras_scaling.compat.status())
    status = keras_scaling.compat.enable()
    status["steps_per_execution"].active   # True: applied, as this Keras needs it
    ```
    """

    fixes: tuple[FixStatus, ...]
    keras_version: str
    disabled_by_env: bool

    def __getitem__(self, name: str) -> FixStatus:
        for fix in self.fixes:
            if fix.name == name:
                return fix
        raise KeyError(f"no fix named {name!r}; fixes: {', '.join(_FIX_NAMES)}")

    @property
    def active(self) -> tuple[str, ...]:
        """The names of the fixes applied now."""
        return tuple(fix.name for fix in self.fixes if fix.active)

    def __str__(self) -> str:
        lines = [f"keras_scaling.compat (Keras {self.keras_version})"]
        if self.disabled_by_env:
            lines[0] += f": off, {NO_COMPAT_ENV}=1"
        for fix in self.fixes:
            lines.append(
                f"  {fix.name:<20} {fix.issue:<28} "
                f"needed={'yes' if fix.needed else 'no':<3} "
                f"active={'yes' if fix.active else 'no':<3} {fix.why}"
            )
        return "\n".join(lines)


def _env_disables():
    value = os.environ.get(NO_COMPAT_ENV, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError(
        f"{NO_COMPAT_ENV} must be 1 (keep Keras untouched) or 0, got {os.environ[NO_COMPAT_ENV]!r}"
    )


def _probe_fix(fix):
    if fix.NAME not in _probe_results:
        _probe_results[fix.NAME] = _GUARDED_PROBES[fix.NAME]()
    return _probe_results[fix.NAME]


def _fix_named(name):
    for fix in _FIXES:
        if fix.NAME == name:
            return fix
    raise ValueError(
        f"name must be one of {', '.join(map(repr, _FIX_NAMES))} or None, got {name!r}"
    )


def _apply_wanted():
    """Applies the needed fixes `disable()` did not turn off; returns the names applied now."""
    global _env_notice_logged
    if _env_disables():
        if not _env_notice_logged:
            _env_notice_logged = True
            logger.info("keras_scaling.compat: %s=1, Keras is left unpatched", NO_COMPAT_ENV)
        return []
    applied = []
    for fix in _FIXES:
        needed, _ = _probe_fix(fix)
        if not needed or fix.NAME in _active or fix.NAME in _disabled_by_user:
            continue
        try:
            owner, attribute = fix.target()
            original = owner.__dict__[attribute]
            replacement = fix.make_replacement(original)
        except _probes.REACH_ERRORS as error:  # the probe read what this cannot find
            _probes.failed(f"compat.{fix.NAME}", error)
            _probe_results[fix.NAME] = (False, f"could not be applied: {error}")
            continue
        setattr(owner, attribute, replacement)
        _active[fix.NAME] = (owner, attribute, original, replacement)
        applied.append(fix.NAME)
    if applied:
        logger.info(
            "keras_scaling.compat: patched Keras %s: %s",
            _keras_source.keras_version(),
            ", ".join(f"{name} ({_fix_named(name).ISSUE})" for name in applied),
        )
    return applied


def enable() -> CompatStatus:
    """Apply the fixes that the installed Keras needs, to every model of the process.

    It reads Keras' source and creates no tensor or device, so it is safe
    before `use_logical_cpus`. It also undoes earlier `disable()` calls, and
    applies nothing with `KERAS_SCALING_NO_COMPAT=1`.

    Returns:
        The `CompatStatus` after enabling.

    Example:

    ```python
    keras_scaling.compat.enable()["steps_per_execution"].active   # True
    ```
    """
    with _lock:
        if not _env_disables():
            _disabled_by_user.clear()
        _apply_wanted()
        return status()


def disable(name: str | None = None) -> CompatStatus:
    """Put Keras' original functions back, until `enable()` is called again.

    A `model.train_function` built while a fix was active keeps it until the
    model is compiled again.

    Args:
        name: the fix to turn off (`"steps_per_execution"`, `"symbolic_build"`,
            `"scalar_reduce"`, `"multi_worker_epoch"`, `"loss_scale_finite"`), or None for all.

    Returns:
        The `CompatStatus` after disabling.

    Raises:
        ValueError: `name` is no fix's name.

    Example:

    ```python
    keras_scaling.compat.disable("steps_per_execution")["steps_per_execution"].active   # False
    status = keras_scaling.compat.disable()   # every fix, until compat.enable()
    ```
    """
    with _lock:
        names = _FIX_NAMES if name is None else (_fix_named(name).NAME,)
        _disabled_by_user.update(names)
        _restore(names)
        return status()


def enable_for(
    strategy: "tf.distribute.Strategy", model: "keras.Model | None" = None
) -> CompatStatus:
    """Apply the fixes a strategy with several replicas needs, but those `disable()` turned off.

    With `model` (from `on_train_begin` or later), a train or test function
    built without the `steps_per_execution` fix is rebuilt with it.
    `symbolic_build` and `multi_worker_epoch` act before any callback: enable
    them before `fit` (`auto_strategy()` does).

    Args:
        strategy: a `tf.distribute.Strategy`.
        model: a Keras model, or None.

    Returns:
        The `CompatStatus` after enabling.

    Raises:
        TypeError: `strategy` is not a `tf.distribute.Strategy`.

    Example:

    ```python
    class MyCallback(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            keras_scaling.compat.enable_for(self.model.distribute_strategy, model=self.model)
    ```
    """
    _enable_for_quietly(strategy, model)
    return status()


def _enable_for_quietly(strategy, model=None):
    """`enable_for` without its `CompatStatus` (tens of microseconds); returns the names applied now."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"strategy must be a tf.distribute.Strategy, got {type(strategy).__name__}")
    if _topology.num_replicas(strategy) < 2:
        return []
    _warn_about_multi_worker_metrics(strategy)
    with _lock:
        applied = _apply_wanted()
        if model is not None:
            _rebuild_functions_built_without_fix(model)
        return applied


def _restore(names):
    """Puts back Keras' functions for the fixes `names`; unlike `disable`, not for good."""
    with _lock:
        restored = []
        for name in [name for name in names if name in _active]:
            owner, attribute, original, replacement = _active.pop(name)
            if owner.__dict__.get(attribute) is not replacement:
                logger.warning(
                    "keras_scaling.compat: other code replaced the %s fix; left as is", name
                )
                continue
            setattr(owner, attribute, original)
            restored.append(name)
        if restored:
            logger.info("keras_scaling.compat: restored Keras' own %s", ", ".join(restored))


_multi_worker_metrics_warned = False


def _warn_about_multi_worker_metrics(strategy):
    global _multi_worker_metrics_warned
    if _multi_worker_metrics_warned or _versions.keras_at_least(3, 10):
        return
    if _keras_trainer.is_multi_worker_collective(strategy):
        _multi_worker_metrics_warned = True
        logger.warning(
            "keras_scaling.compat: Keras %s reports wrong loss and metric values under "
            "MultiWorkerMirroredStrategy (the training is right): pip install 'keras>=3.10'",
            _keras_source.keras_version(),
        )


def _rebuild_functions_built_without_fix(model):
    if _steps_per_execution.NAME not in _active or getattr(model, "steps_per_execution", 1) == 1:
        return
    for kind in ("train", "test"):
        function = getattr(model, f"{kind}_function", None)
        if function is not None and not getattr(function, _steps_per_execution.BUILT_BY_FIX, False):
            getattr(model, f"make_{kind}_function")(force=True)


def status() -> CompatStatus:
    """Which fixes exist, whether this Keras needs them and whether they are on.

    Returns:
        A `CompatStatus`, whose `str()` is a table; `status()["scalar_reduce"]`
        is one `FixStatus`.

    Example:

    ```python
    print(keras_scaling.compat.status())
    # keras_scaling.compat (Keras 3.15.1)
    #   steps_per_execution  keras-team/keras#19246  needed=yes active=yes ...
    ```
    """
    with _lock:
        disabled_by_env = _env_disables()
        fixes = []
        for fix in _FIXES:
            needed, reason = _probe_fix(fix)
            active = fix.NAME in _active
            if active:
                state = "applied"
            elif not needed:
                state = "not applied"
            elif disabled_by_env:
                state = f"not applied: {NO_COMPAT_ENV}=1"
            elif fix.NAME in _disabled_by_user:
                state = "not applied: turned off by disable()"
            else:
                state = "not applied yet: no strategy with several replicas met"
            why = f"{reason}; {state}"
            fixes.append(FixStatus(fix.NAME, fix.ISSUE, fix.SUMMARY, needed, active, why))
        return CompatStatus(tuple(fixes), _keras_source.keras_version(), disabled_by_env)
