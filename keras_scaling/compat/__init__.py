"""Fixes for Keras 3 defects of `model.fit` under `tf.distribute`.

Three defects break `fit`; one makes it read only part of the data.

Each fix replaces one function of Keras' TensorFlow trainer while it is
active, and `disable()` puts the original function object back:

| fix                   | upstream issue              | symptom without it |
|-----------------------|-----------------------------|--------------------|
| `steps_per_execution` | keras-team/keras#19246      | `fit`/`evaluate` with `steps_per_execution > 1` on several replicas: "You must feed a value for placeholder tensor 'while/cond/Placeholder'" |
| `symbolic_build`      | keras-team/keras#20585      | `fit` under `MultiWorkerMirroredStrategy`: "Attempt to convert a value (PerReplica: ...)"; on any strategy with several replicas, `MirroredStrategy` included, a `bool` or `string` model input (keras-hub's `padding_mask`, raw text into `TextVectorization`): "Value for attr 'T' of bool is not in the list of allowed values" |
| `scalar_reduce`       | tensorflow/tensorflow#72388 | metrics under `MultiWorkerMirroredStrategy`: "Invalid reduction dimension 0 for input with 0 dimensions" |
| `multi_worker_epoch`  | no upstream issue           | under `MultiWorkerMirroredStrategy`, `fit`, `evaluate` and `predict` stop after `1 / num_workers` of each worker's dataset when its `AutoShardPolicy` is OFF (as `keras_scaling.data.distribute` makes it) |

`keras_scaling` enables them by itself whenever it meets a strategy with more
than one replica (`auto_strategy()`, `data.distribute()`, its callbacks).
Set the environment variable `KERAS_SCALING_NO_COMPAT=1` to keep Keras
untouched, or call `keras_scaling.compat.disable()`.
"""

import dataclasses
import logging
import os
import threading
from typing import TYPE_CHECKING

from keras_scaling.compat import (
    _keras_source,
    _keras_trainer,
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

# The environment variable that keeps Keras untouched when set to 1.
NO_COMPAT_ENV = "KERAS_SCALING_NO_COMPAT"

_FIXES = (_steps_per_execution, _symbolic_build, _scalar_reduce, _multi_worker_epoch)
_FIX_NAMES = tuple(fix.NAME for fix in _FIXES)
_lock = threading.RLock()
# name -> (owner, attribute, original object, replacement)
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
        workaround=(
            "Check keras_scaling.compat.status(), and see 'Supported versions' "
            "in keras_scaling's README."
        ),
        fallback=(False, "the installed Keras could not be read (see the warning)"),
    )(fix.probe)


_GUARDED_PROBES = {fix.NAME: _guard_probe(fix) for fix in _FIXES}


@dataclasses.dataclass(frozen=True)
class FixStatus:
    """One fix: what it repairs, whether this Keras needs it and whether it is on.

    Args:
        name: the fix's name, such as `"steps_per_execution"`.
        issue: the upstream issue, such as `"keras-team/keras#19246"`.
        summary: the defect and what the fix changes, in one sentence.
        needed: whether the installed Keras has the defect.
        active: whether the fix is applied now.
        why: why it is needed or not, and why it is active or not.

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
        fixes: a tuple of `FixStatus`, one per fix.
        keras_version: the installed Keras version.
        disabled_by_env: whether `KERAS_SCALING_NO_COMPAT` turns the fixes off.

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


def _log_env_notice_once():
    global _env_notice_logged
    if not _env_notice_logged:
        _env_notice_logged = True
        logger.info("keras_scaling.compat: %s=1, Keras is left unpatched", NO_COMPAT_ENV)


def _apply(fixes):
    """Applies the needed fixes among `fixes`; returns the names applied now."""
    applied = []
    for fix in fixes:
        needed, _ = _probe_fix(fix)
        if not needed or fix.NAME in _active:
            continue
        try:
            owner, attribute = fix.target()
            original = owner.__dict__[attribute]
            replacement = fix.make_replacement(original)
        except Exception as error:  # the probe read what this cannot find
            _probes.failed(f"compat.{fix.NAME}", error)
            _probe_results[fix.NAME] = (False, f"could not be applied: {error}")
            continue
        setattr(owner, attribute, replacement)
        _active[fix.NAME] = (owner, attribute, original, replacement)
        applied.append(fix.NAME)
    return applied


def _log_applied(applied):
    if applied:
        logger.info(
            "keras_scaling.compat: patched Keras %s: %s",
            _keras_source.keras_version(),
            ", ".join(f"{name} ({_fix_named(name).ISSUE})" for name in applied),
        )


def enable() -> CompatStatus:
    """Apply the fixes that the installed Keras needs.

    Whether a fix is needed is decided by reading the installed Keras (the
    source of the function it replaces), which creates no tensor, device or
    strategy, so `enable()` is safe anywhere, even before
    `keras_scaling.use_logical_cpus`. The fixes act on every model of the
    process from then on. Calling it again changes nothing; it logs once, on
    the `keras_scaling` logger, which fixes it applied. With
    `KERAS_SCALING_NO_COMPAT=1` in the environment it applies nothing.

    `enable()` also undoes earlier `disable()` calls: fixes turned off by
    `disable()` are otherwise left off by the automatic `enable_for`.

    Returns:
        The `CompatStatus` after enabling.

    Example:

    ```python
    import keras_scaling
    keras_scaling.compat.enable()
    print(keras_scaling.compat.status())
    ```
    """
    with _lock:
        if _env_disables():
            _log_env_notice_once()
            return status()
        _disabled_by_user.clear()
        _log_applied(_apply(_FIXES))
        return status()


def disable(name: str | None = None) -> CompatStatus:
    """Restore Keras exactly: put the original functions back.

    The fixes stay off until `enable()` is called again: the automatic
    `enable_for` (from `auto_strategy()`, `data.distribute()` and the
    callbacks) does not turn them back on. Functions Keras already built for
    a model while a fix was active (`model.train_function`) keep the fix
    until the model is compiled again.

    Args:
        name: the fix to turn off, one of `"steps_per_execution"`,
            `"symbolic_build"`, `"scalar_reduce"` and `"multi_worker_epoch"`;
            `None` (the default) turns off all of them.

    Returns:
        The `CompatStatus` after disabling.

    Example:

    ```python
    # Every fix:
    keras_scaling.compat.disable()
    # Only this one:
    keras_scaling.compat.disable("steps_per_execution")
    ```
    """
    with _lock:
        names = _FIX_NAMES if name is None else (_fix_named(name).NAME,)
        restored = []
        for fix_name in names:
            _disabled_by_user.add(fix_name)
            if fix_name not in _active:
                continue
            owner, attribute, original, replacement = _active.pop(fix_name)
            if owner.__dict__.get(attribute) is not replacement:
                logger.warning(
                    "keras_scaling.compat: %s.%s was replaced by other code "
                    "after the %s fix; leaving it as it is",
                    owner.__name__,
                    attribute,
                    fix_name,
                )
                continue
            setattr(owner, attribute, original)
            restored.append(fix_name)
        if restored:
            logger.info("keras_scaling.compat: restored Keras' own %s", ", ".join(restored))
        return status()


def enable_for(
    strategy: "tf.distribute.Strategy", model: "keras.Model | None" = None
) -> CompatStatus:
    """Apply the fixes a strategy needs, in time for the `fit` in progress.

    With more than one replica in sync this enables the fixes Keras needs
    (see `enable()`); with one replica it does nothing. It is cheap: call
    it every time a strategy is met. It does nothing with
    `KERAS_SCALING_NO_COMPAT=1`, and leaves off the fixes `disable()` turned
    off.

    `fit` builds `model.train_function` after the callbacks' `set_model` and
    before their `on_train_begin` (`evaluate` builds `model.test_function`
    before `on_test_begin`), and reuses it until the model is compiled
    again. Pass `model` when calling from `on_train_begin` or later, or after
    the model has already run: a train or test function built without the
    `steps_per_execution` fix is then rebuilt with it, so the `fit` or
    `evaluate` in progress uses it (their loops look the function up at
    every step). The `symbolic_build` and `multi_worker_epoch` fixes act
    when `fit`, `evaluate` or `predict` starts, before callbacks run, so
    under `MultiWorkerMirroredStrategy`, and for `bool` or `string` model
    inputs on any strategy, enable them before those calls
    (`auto_strategy()`, `data.distribute()` or `enable()` do).

    Args:
        strategy: a `tf.distribute.Strategy`.
        model: a Keras model, or `None` (the default).

    Returns:
        The `CompatStatus` after enabling.

    Example:

    ```python
    class MyCallback(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            keras_scaling.compat.enable_for(
                self.model.distribute_strategy, model=self.model
            )
    ```
    """
    _enable_for_quietly(strategy, model)
    return status()


def _enable_for_quietly(strategy, model=None):
    """`enable_for` without building its `CompatStatus`, for the callbacks, which discard it.

    Probing every fix for the status costs tens of microseconds, paid at
    every `fit` by the callbacks, which call this instead.

    Args:
        strategy: a `tf.distribute.Strategy`.
        model: a Keras model, or `None` (the default).

    Returns:
        list of the names of the fixes applied by this call (a callback
        that enabled them on its own puts Keras back with `_restore` when
        its fit ends).
    """
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"strategy must be a tf.distribute.Strategy, got {type(strategy).__name__}")
    if _topology.num_replicas(strategy) < 2:
        return []
    _warn_about_multi_worker_metrics(strategy)
    with _lock:
        if _env_disables():
            _log_env_notice_once()
            return []
        wanted = [fix for fix in _FIXES if fix.NAME not in _disabled_by_user]
        applied = _apply(wanted)
        _log_applied(applied)
        if model is not None:
            _rebuild_functions_built_without_fix(model)
        return applied


def _restore(names):
    """Puts back Keras' own functions for the fixes `names`, unlike `disable` not for good.

    For the fixes a callback applied on its own, when its fit ends: a later
    `enable_for` applies them again. A function replaced by other code since
    is left as it is.
    """
    with _lock:
        restored = []
        for name in names:
            if name not in _active:
                continue
            owner, attribute, original, replacement = _active[name]
            if owner.__dict__.get(attribute) is not replacement:
                continue
            del _active[name]
            setattr(owner, attribute, original)
            restored.append(name)
        if restored:
            logger.info("keras_scaling.compat: restored Keras' own %s", ", ".join(restored))


_MULTI_WORKER_METRICS_WARNING = (
    "keras_scaling.compat: Keras %s reports wrong loss and metric values in fit "
    "and evaluate under MultiWorkerMirroredStrategy (a sum over 50 samples "
    "reads 1346); the training itself (steps, weights) is right. Keras 3.10 "
    "and newer report them right: pip install --upgrade 'keras>=3.10'."
)
_multi_worker_metrics_warned = False


def _warn_about_multi_worker_metrics(strategy):
    global _multi_worker_metrics_warned
    if _multi_worker_metrics_warned or _versions.keras_at_least(3, 10):
        return
    if _keras_trainer.is_multi_worker_collective(strategy):
        _multi_worker_metrics_warned = True
        logger.warning(_MULTI_WORKER_METRICS_WARNING, _keras_source.keras_version())


def _rebuild_functions_built_without_fix(model):
    if _steps_per_execution.NAME not in _active:
        return
    if getattr(model, "steps_per_execution", 1) == 1:
        return
    for attribute, make in (
        ("train_function", "make_train_function"),
        ("test_function", "make_test_function"),
    ):
        function = getattr(model, attribute, None)
        if function is not None and not getattr(function, _steps_per_execution.BUILT_BY_FIX, False):
            getattr(model, make)(force=True)


def status() -> CompatStatus:
    """Which fixes exist, whether this Keras needs them and whether they are on.

    Returns:
        A `CompatStatus`: `str()` of it is a readable table, and
        `status()["steps_per_execution"]` is one fix's `FixStatus` (name,
        upstream issue, needed, active and why).

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
            fixes.append(
                FixStatus(
                    name=fix.NAME,
                    issue=fix.ISSUE,
                    summary=fix.SUMMARY,
                    needed=needed,
                    active=active,
                    why=f"{reason}; {state}",
                )
            )
        return CompatStatus(
            fixes=tuple(fixes),
            keras_version=_keras_source.keras_version(),
            disabled_by_env=disabled_by_env,
        )
