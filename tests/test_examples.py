"""The examples run as they are, on this CPU-only machine, and do what they say.

Both examples start at once (each in a process of its own, as a user runs
them) so their start-up times overlap; each test then checks one of them.
"""

import json
import os
import subprocess
import sys

import pytest

from keras_scaling.summaries import _tensorboard

_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples")
_TIMEOUT_S = 300


class _Run:
    def __init__(self, script, log_dir, *args):
        self.log_dir = log_dir
        self._process = subprocess.Popen(
            [
                sys.executable,
                os.path.join(_EXAMPLES, script),
                "--log-dir",
                str(log_dir),
                *map(str, args),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        self._result = None

    def result(self):
        if self._result is None:
            try:
                stdout, stderr = self._process.communicate(timeout=_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                stdout, stderr = self._process.communicate()
                pytest.fail(f"example timed out after {_TIMEOUT_S} s:\n{stderr[-3000:]}")
            self._result = (self._process.returncode, stdout, stderr)
        return self._result

    def stop(self):
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("examples")
    started = {
        "mirrored_fit": _Run(
            "mirrored_fit.py", root / "mirrored", "--epochs", "2", "--samples", "2048"
        ),
        "tpu_fit": _Run("tpu_fit.py", root / "tpu", "--samples", "96", "--per-replica-batch", "8"),
        "preemptible_fit": _Run(
            "preemptible_fit.py",
            root / "preemptible",
            "--samples",
            "1024",
            "--stop-at-step",
            "20",
        ),
    }
    yield started
    for run in started.values():
        run.stop()


def test_mirrored_fit_trains_on_two_logical_cpus_and_logs_to_tensorboard(runs):
    run = runs["mirrored_fit"]
    returncode, stdout, stderr = run.result()

    assert returncode == 0, stderr[-3000:]
    assert "MirroredStrategy: 1 worker, 2 replicas on CPU" in stdout
    assert f"Open TensorBoard: tensorboard --logdir {run.log_dir}" in stdout
    with open(run.log_dir / "throughput.json") as file:
        throughput = json.load(file)
    assert throughput["num_replicas"] == 2
    assert throughput["global_batch_size"] == 128
    keras_scalars = _tensorboard.read_scalars(run.log_dir / "train")
    losses = [value for _, value in keras_scalars["epoch_loss"]]
    assert len(losses) == 2 and losses[1] < losses[0]
    # ThroughputLogger, in a run directory of its own beside Keras' train.
    assert "throughput/samples_per_sec" in _tensorboard.read_scalars(
        _tensorboard.run_dir(run.log_dir)
    )


def test_tpu_fit_falls_back_to_this_machine_with_static_shapes_and_fused_steps(runs):
    run = runs["tpu_fit"]
    returncode, stdout, stderr = run.result()

    assert returncode == 0, stderr[-3000:]
    assert "1 replica on CPU" in stdout
    assert "Static batch shape: (8, 32, 32, 3)" in stdout
    assert "steps_per_execution=4: 12 steps per epoch in 3 compiled calls" in stdout
    assert "Trained 1 epoch(s) of 12 steps, global batch 8" in stdout
    assert "epoch_loss" in _tensorboard.read_scalars(run.log_dir / "train")
    assert os.path.exists(run.log_dir / "throughput.json")


def test_preemptible_fit_exits_75_when_preempted_and_the_same_command_resumes(runs):
    run = runs["preemptible_fit"]
    returncode, _, stderr = run.result()
    assert returncode == 75, stderr[-3000:]
    assert "saved a backup at optimizer step 21" in stderr

    resumed = _Run("preemptible_fit.py", run.log_dir, "--samples", "1024")
    returncode, stdout, stderr = resumed.result()

    assert returncode == 0, stderr[-3000:]
    # 1024 samples, 32 per replica on 2 replicas: 16 steps per epoch, 3 epochs.
    assert "finished: 48 optimizer steps" in stdout
    assert not os.path.exists(run.log_dir / "backup" / "backup.npz")
