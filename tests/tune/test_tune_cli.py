"""`keras-scaling tune` through `keras_scaling.cli.main` and under `keras-scaling launch`: short real searches, and bad input with exit 2."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import keras_scaling
from keras_scaling.cli import _sweep_plan, main

# Mostly the search's sleeping steps: make test runs this file beside the others.
pytestmark = pytest.mark.mostly_waits

# The first process's search has what the knobs measured in processes of
# their own (35%, half from 150 s on) and its start leave; on a loaded machine
# one candidate took ~31 s (its warm-ups and 3 round pairs), which a start of
# 12 s left no room for at 60 s, nor one of 24 s at 90 s, and beside a whole
# make test one asked for 142 s at 120 s. The default budget, as users run it.
_BUDGET_S = 180

# The steps of tests/tune/sleeping_models.py sleep: the rounds last as long,
# but leave the cores to the rest of the test run (the command took 18-25 CPU
# s, 48-75 with the mlp preset).
_SLEEPING_MODELS = pathlib.Path(__file__).with_name("sleeping_models.py")


def test_tune_writes_tune_json_that_load_applies(tmp_path, monkeypatch, capfd):
    (tmp_path / "sleeping_models.py").write_text(_SLEEPING_MODELS.read_text())
    monkeypatch.chdir(tmp_path)
    log_dir = tmp_path / "tune"
    status = main(
        [
            "tune",
            "--cpu-devices", "2",
            "--model", "sleeping_models:build",
            "--per-replica-batch", "32",
            "--budget", str(_BUDGET_S),
            "--logdir", str(log_dir),
        ]
    )  # fmt: skip
    assert status == 0
    out = capfd.readouterr().out
    record = json.loads((log_dir / "tune.json").read_text())
    assert record["replicas"] == 2
    assert record["start"]["settings"]["data"] == {"per_replica_batch_size": 32, "shuffle": False}
    assert record["budget_s"] == _BUDGET_S
    # The whole command, its processes' start included; a little slack for
    # a loaded machine, where ending a process can take longer.
    assert record["elapsed_s"] <= _BUDGET_S * 1.2
    # On two logical CPUs the all-reduce and the thread pools are knobs, each
    # in a process of their own; the start's pools are the bench's.
    knobs = [trial["knob"] for trial in record["trials"]]
    assert "cross_device_ops" in knobs and "cpu_threads" in knobs
    # Candidates of the search in processes (not left out for the budget):
    # measured, or not for want of time on a loaded machine.
    for trial in record["trials"]:
        if trial["knob"] in ("cross_device_ops", "cpu_threads"):
            assert trial["rounds"] or trial["reason"].startswith("not measured"), trial
    assert record["start"]["settings"]["cpu"] == {
        "n": 2,
        "threads_per_device": max(1, _sweep_plan.available_cores() // 2),
        "inter_op_threads": 2,
    }
    assert "steps_per_execution" in out and 'keras_scaling.tune.load("' in out
    tuned = keras_scaling.tune.load(log_dir / "tune.json")
    assert tuned.compile_kwargs == record["best"]["settings"]["compile"]
    assert tuned.cpu_kwargs == record["best"]["settings"]["cpu"]


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--allow", "batch,fast"], "unknown knob 'fast'"),
        (["--budget", "3"], "pass --budget 10 or more"),
        (["--model", "not_a_preset"], "neither a preset"),
    ],
)
def test_bad_input_exits_2_naming_the_fix(arguments, message, capfd):
    assert main(["tune", *arguments]) == 2
    assert message in capfd.readouterr().err


def test_a_model_that_cannot_be_built_exits_2_naming_it(tmp_path, monkeypatch, capfd):
    (tmp_path / "broken_models.py").write_text(
        "def build():\n    raise RuntimeError('no weights file')\n"
    )
    monkeypatch.chdir(tmp_path)
    status = main(
        ["tune", "--cpu-devices", "2", "--model", "broken_models:build", "--budget", "20",
         "--logdir", str(tmp_path / "logs")]
    )  # fmt: skip
    assert status == 2
    err = capfd.readouterr().err
    assert "--model 'broken_models:build' could not be built" in err
    assert "no weights file" in err


def test_under_launch_every_worker_searches_in_step_and_the_chief_writes(tmp_path):
    (tmp_path / "sleeping_models.py").write_text(_SLEEPING_MODELS.read_text())
    log_dir = tmp_path / "tune"
    # Beside the other sessions of `make test`, the start alone once took 22 s of a budget of 40.
    budget_s = 60
    # `-X importtime` lists on stderr the modules each task's own process imports.
    tune = [sys.executable, "-X", "importtime", "-m", "keras_scaling", "tune",
            "--model", "sleeping_models:build", "--per-replica-batch", "16",
            "--budget", str(budget_s), "--logdir", str(log_dir)]  # fmt: skip
    launch = [sys.executable, "-m", "keras_scaling", "launch", "--workers", "2", "--cpu-devices", "1"]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [*launch, "--", *tune], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((log_dir / "tune.json").read_text())
    assert (record["workers"], record["replicas"]) == (2, 2)
    assert record["elapsed_s"] <= budget_s * 1.2
    reasons = {trial["knob"]: trial["reason"] for trial in record["trials"]}
    assert "bytes_per_pack" in reasons
    assert "across workers the search tries communication" in reasons["cross_device_ops"]
    assert "whole cluster restarted" in reasons["cpu_threads"]
    # Each task prints the table once; only the chief writes tune.json.
    tables = [line.split("]")[0] for line in result.stdout.splitlines() if "| knob " in line]
    assert sorted(tables) == ["[worker 0", "[worker 1"]
    assert sorted(path.name for path in log_dir.glob("**/tune.json")) == ["tune.json"]
    # Only the processes that train load TensorFlow, not the command that starts them.
    imported = [
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if "import time:" in line
    ]
    assert "keras_scaling.cli.tune" in imported and "keras_scaling.tune._search" in imported
    assert "tensorflow" not in imported


class _HalfRunner:
    """Serves rounds of every setting but those with a cache, which raise."""

    def round(self, settings, steps):
        if settings["data"].get("cache"):
            raise MemoryError("the cache does not fit")
        return 1000.0 * steps, 0.5


def test_a_serving_worker_answers_a_failed_round_and_keeps_serving(monkeypatch, capsys):
    import io

    from keras_scaling.cli import _tune_worker, tune

    requests = [
        {"settings": {"data": {"cache": True}}, "steps": 4},
        {"settings": {"data": {}}, "steps": 4},
    ]
    lines = [json.dumps(request) + "\n" for request in requests] + [tune.QUIT + "\n"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(lines)))
    _tune_worker._serve(_HalfRunner())
    assert capsys.readouterr().out.splitlines() == [
        tune.READY,
        f"{tune.FAILED}MemoryError: the cache does not fit",
        f"{tune.RATE}4000.0 0.5",
    ]
