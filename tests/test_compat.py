"""keras_scaling.compat in a process without several replicas: switching and reporting."""

import json
import logging
import os
import subprocess
import sys

import keras
import pytest

from keras_scaling import compat
from keras_scaling.compat import _keras_trainer

FIX_NAMES = (
    "steps_per_execution",
    "symbolic_build",
    "scalar_reduce",
    "multi_worker_epoch",
    "loss_scale_finite",
)
SUBPROCESS_TIMEOUT_S = 120


def keras_originals():
    trainer = _keras_trainer.trainer_class().__dict__
    module = _keras_trainer.trainer_module()
    return {
        "_make_function": trainer["_make_function"],
        "_maybe_symbolic_build": trainer["_maybe_symbolic_build"],
        "reduce_per_replica": module.reduce_per_replica,
        "TFEpochIterator.__init__": module.TFEpochIterator.__dict__["__init__"],
        "check_finite": keras.optimizers.LossScaleOptimizer.__dict__["check_finite"],
    }


@pytest.fixture(autouse=True)
def compat_left_as_found(monkeypatch):
    monkeypatch.delenv(compat.NO_COMPAT_ENV, raising=False)
    was_active = compat.status().active
    yield
    monkeypatch.delenv(compat.NO_COMPAT_ENV, raising=False)
    compat.disable()
    if was_active:
        compat.enable()


def run_python(code, **env):
    """Runs `code` in a fresh interpreter; returns the JSON it prints last."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in (compat.NO_COMPAT_ENV, "TF_CONFIG")
    }
    environment.update(TF_CPP_MIN_LOG_LEVEL="2", **env)
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=environment,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_status_lists_every_fix_with_its_upstream_issue():
    status = compat.status()

    assert [fix.name for fix in status.fixes] == list(FIX_NAMES)
    assert status["steps_per_execution"].issue == "keras-team/keras#19246"
    assert status["symbolic_build"].issue == "keras-team/keras#20585"
    assert status["scalar_reduce"].issue == "tensorflow/tensorflow#72388"
    assert status["multi_worker_epoch"].issue == "no upstream issue"
    assert status["loss_scale_finite"].issue == "no upstream issue"
    text = str(status)
    for name in FIX_NAMES:
        assert name in text


def test_reading_the_installed_keras_finds_every_defect():
    status = compat.status()

    for fix in status.fixes:
        assert fix.needed, (
            f"Keras {status.keras_version} no longer has the code behind "
            f"{fix.issue} ({fix.why}): check with the test "
            f"test_keras_still_needs_the_{fix.name}_fix whether the {fix.name} "
            "fix can be dropped"
        )
    assert "tf.cond" in status["steps_per_execution"].why
    assert "cardinality" in status["multi_worker_epoch"].why


def test_enable_replaces_keras_functions_and_status_says_so():
    originals = keras_originals()

    status = compat.enable()

    assert status.active == FIX_NAMES
    assert all(fix.active and "applied" in fix.why for fix in status.fixes)
    replaced = keras_originals()
    for name, original in originals.items():
        assert replaced[name] is not original, name


def test_disable_puts_the_original_function_objects_back():
    compat.disable()
    originals = keras_originals()
    compat.enable()

    status = compat.disable()

    assert status.active == ()
    restored = keras_originals()
    for name, original in originals.items():
        assert restored[name] is original, name


def test_disable_one_fix_leaves_the_others_active():
    compat.enable()

    status = compat.disable("scalar_reduce")

    assert status.active == (
        "steps_per_execution",
        "symbolic_build",
        "multi_worker_epoch",
        "loss_scale_finite",
    )
    assert "turned off by disable()" in status["scalar_reduce"].why


def test_enable_twice_changes_nothing_and_logs_once(caplog):
    compat.disable()
    caplog.set_level(logging.INFO, logger="keras_scaling")

    compat.enable()
    after_first = keras_originals()
    compat.enable()

    assert keras_originals() == after_first
    patched = [r for r in caplog.records if "patched Keras" in r.getMessage()]
    assert len(patched) == 1
    for name in FIX_NAMES:
        assert name in patched[0].getMessage()


def test_no_compat_env_makes_enable_change_nothing(monkeypatch):
    compat.disable()
    originals = keras_originals()
    monkeypatch.setenv(compat.NO_COMPAT_ENV, "1")

    status = compat.enable()

    assert keras_originals() == originals
    assert status.disabled_by_env
    assert "KERAS_SCALING_NO_COMPAT=1" in status["steps_per_execution"].why


def test_unknown_fix_name_is_rejected():
    with pytest.raises(ValueError, match="'steps_per_execution'.*got 'nope'"):
        compat.disable("nope")


def test_enable_for_rejects_what_is_not_a_strategy():
    with pytest.raises(TypeError, match="tf.distribute.Strategy, got str"):
        compat.enable_for("mirrored")


def test_invalid_no_compat_env_value_is_rejected(monkeypatch):
    monkeypatch.setenv(compat.NO_COMPAT_ENV, "maybe")

    with pytest.raises(ValueError, match="KERAS_SCALING_NO_COMPAT must be 1.*'maybe'"):
        compat.enable()


AUTO_STRATEGY_CODE = """
import json
from keras_scaling import compat
compat.status()  # probes every fix before any device exists
import keras_scaling
strategy = keras_scaling.auto_strategy()  # splits the CPU: fails if devices exist
print(json.dumps({
    "kind": type(strategy).__name__,
    "replicas": strategy.num_replicas_in_sync,
    "active": list(compat.status().active),
}))
"""


def test_probing_creates_no_device_and_auto_strategy_enables_the_fixes():
    # Also the test of KERAS_SCALING_CPU_DEVICES: auto_strategy mirrors over 2 logical CPUs.
    report = run_python(AUTO_STRATEGY_CODE, KERAS_SCALING_CPU_DEVICES="2")

    assert report == {"kind": "MirroredStrategy", "replicas": 2, "active": list(FIX_NAMES)}


NO_COMPAT_CODE = """
import json
from keras_scaling import compat
from keras_scaling.compat import _keras_trainer
import keras
import keras_scaling
def functions():
    trainer, module = _keras_trainer.trainer_class(), _keras_trainer.trainer_module()
    return (trainer.__dict__["_make_function"],
            trainer.__dict__["_maybe_symbolic_build"],
            module.reduce_per_replica,
            module.TFEpochIterator.__dict__["__init__"],
            keras.optimizers.LossScaleOptimizer.__dict__["check_finite"])
before = functions()
strategy = keras_scaling.auto_strategy()
compat.enable_for(strategy)
after = functions()
print(json.dumps({
    "replicas": strategy.num_replicas_in_sync,
    "untouched": all(a is b for a, b in zip(before, after)),
    "active": list(compat.status().active),
}))
"""


def test_no_compat_env_keeps_auto_strategy_from_patching_keras():
    report = run_python(NO_COMPAT_CODE, KERAS_SCALING_CPU_DEVICES="2", KERAS_SCALING_NO_COMPAT="1")

    assert report == {"replicas": 2, "untouched": True, "active": []}
