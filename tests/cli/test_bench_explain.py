"""`keras-scaling bench --explain --data mod:fn`: each count's step split, in the terminal, explain.json and TensorBoard.

The bench runs as a subprocess, as a user would; each replica count runs in
a child process of its own, so this pytest process needs no logical CPUs.
"""

import json
import os
import subprocess
import sys
import textwrap

from keras_scaling.summaries import _tensorboard

_TIMEOUT_S = 600

_DATA_MODULE = textwrap.dedent(
    """
    import numpy as np


    def load():
        rng = np.random.default_rng(0)
        x = rng.random((512, 784), dtype="float32")
        y = rng.integers(0, 10, size=(512,))
        return x, y
    """
)


def _bench(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "keras_scaling", "bench", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        cwd=cwd,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )


def test_bench_explain_with_user_data_splits_each_count_and_writes_json_and_tensorboard(tmp_path):
    (tmp_path / "user_data.py").write_text(_DATA_MODULE)
    log_dir = tmp_path / "logs"
    result = _bench(
        "--cpu-devices", 2, "--replicas", "1,2", "--steps", 10, "--per-replica-batch", 8,
        "--explain", "--data", "user_data:load", "--logdir", log_dir,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Explain: the step split into input, compute, synchronization and host" in result.stdout
    assert "2 replica(s): " in result.stdout
    assert "replicas are logical CPUs of one host and share" in result.stdout

    record = json.loads((log_dir / "explain.json").read_text())
    assert record["schema_version"] == 1 and record["data"] == "user_data:load"
    counts = record["counts"]
    assert [count["replicas"] for count in counts] == [1, 2]
    assert [count["per_replica_batch_size"] for count in counts] == [8, 8]
    for count in counts:
        assert set(count["parts"]) == {"input", "compute", "synchronization", "host"}
        parts_ms = sum(part["ms"] for part in count["parts"].values())
        assert abs(parts_ms + count["rest_ms"] - count["step_ms"]) < 1e-6
        assert count["verdict"]["bound"] in count["parts"]
        assert count["pipeline_samples_per_sec"] > 0
        # The verdict names the part whose removal shortens the step most.
        saved_ms = {name: part["saved_ms"] for name, part in count["parts"].items()}
        assert saved_ms[count["verdict"]["bound"]] == max(saved_ms.values())
        assert count["input_free_step_ms"] > 0
        assert count["variants"]["input_wait"]["median_s"] >= 0
    assert counts[0]["parts"]["synchronization"]["ms"] == 0  # one replica has nothing to sync

    summaries = _tensorboard.read_summaries(log_dir / "explain")
    assert [point.step for point in summaries["explain/step_ms"]] == [1, 2]
    verdict = summaries["explain/verdict"][0].value
    assert "2 replica(s): " in verdict


def test_bench_data_that_cannot_be_imported_is_a_usage_error(tmp_path, capsys):
    # In this process: --data is checked before any replica runs.
    from keras_scaling.cli import main

    args = ["--cpu-devices", "2", "--data", "no_such_module:load", "--logdir", tmp_path / "logs"]
    status = main(["bench", *map(str, args)])

    assert status == 2
    assert "--data 'no_such_module:load': cannot import module" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()
