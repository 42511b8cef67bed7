"""keras_scaling.compat under MultiWorkerMirroredStrategy: 2 local workers on 127.0.0.1.

Each worker is its own process (`tests/workers/compat_worker.py`), started by
`keras_scaling.launcher.launch` with 1 or 2 logical CPUs (`cpu_devices`, as
`keras-scaling launch --cpu-devices` sets them): one replica per worker, where
Keras sees each worker's values as plain tensors, and two, where it sees
per-replica values. Besides arrays, they train, evaluate and predict on
datasets holding each worker's own share with TensorFlow's sharding off (from
`keras_scaling.data.distribute`, and one split by hand), where the
`multi_worker_epoch` fix decides how long an epoch is, and on a model with a
bool, an int and a string input (Keras' build from the first batch fails on
bool and string without the `symbolic_build` fix). The workers run once
per CPU count; every test reads what they wrote.
"""

import collections
import io
import json
import math
import os
import pathlib
import sys

import numpy as np
import pytest

from keras_scaling.internals import _versions
from keras_scaling.launch import launcher

WORKER_SCRIPT = pathlib.Path(__file__).parent / "workers" / "compat_worker.py"
NUM_WORKERS = 2
WORKERS_TIMEOUT_S = 240
# Each test's limit includes the workers' run when its fixture starts them.
pytestmark = pytest.mark.timeout(WORKERS_TIMEOUT_S + 60)
# Must match tests/workers/compat_worker.py.
NUM_SAMPLES = 96
STEPS_PER_EPOCH = 6
EPOCHS = 2
NUM_IDS = 50
SHARES_STEPS_PER_EXECUTION = 3


@pytest.fixture(scope="module", params=[1, 2], ids=["1cpu_per_worker", "2cpus_per_worker"])
def workers(request, tmp_path_factory):
    """Runs the workers to the end under `launch`; returns (output dir, per-worker reports)."""
    cpus_per_worker = request.param
    out_dir = tmp_path_factory.mktemp(f"compat_workers_{cpus_per_worker}cpu")
    env = {key: value for key, value in os.environ.items() if key != "KERAS_SCALING_NO_COMPAT"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    output = io.StringIO()
    outcome = launcher.launch(
        [sys.executable, str(WORKER_SCRIPT), str(out_dir)],
        NUM_WORKERS,
        cpu_devices=cpus_per_worker,
        env=env,
        stdout=output,
        stderr=output,
    )
    if outcome.exit_code != 0:
        pytest.fail(f"{outcome.message}; output: {output.getvalue()[-3000:]}")
    (out_dir / "launch.log").write_text(output.getvalue())
    reports = [
        json.loads((out_dir / f"worker{index}.json").read_text()) for index in range(NUM_WORKERS)
    ]
    return out_dir, reports, cpus_per_worker


def metric_values_are_right(out_dir):
    """Whether this Keras reports metrics right under MultiWorkerMirroredStrategy.

    Keras 3.8 does not; keras_scaling then says so once on every worker.
    """
    if _versions.keras_at_least(3, 10):
        return True
    output = (out_dir / "launch.log").read_text()
    for index in range(NUM_WORKERS):
        assert (
            f"[worker {index}] keras_scaling.compat: Keras {_versions.keras_version()} "
            "reports wrong loss and metric values" in output
        )
    return False


def test_fit_evaluate_predict_work_on_two_workers(workers):
    _, reports, cpus_per_worker = workers

    for report in reports:
        assert report["strategy"] == "MultiWorkerMirroredStrategy"
        assert report["num_replicas"] == NUM_WORKERS * cpus_per_worker
        assert report["iterations"] == EPOCHS * STEPS_PER_EPOCH
        assert report["loss"][1] < report["loss"][0]
        assert np.isfinite(report["evaluate"]["loss"])
        assert report["predict_shape"] == [NUM_SAMPLES, 1]
    assert reports[0]["evaluate"] == reports[1]["evaluate"]


def test_workers_end_with_bitwise_identical_weights(workers):
    out_dir, _, _ = workers
    weight_files = sorted(out_dir.glob("worker0_weight*.npy"))

    assert len(weight_files) == 4
    for worker0_file in weight_files:
        worker1_file = out_dir / worker0_file.name.replace("worker0", "worker1")
        np.testing.assert_array_equal(np.load(worker0_file), np.load(worker1_file))


def test_keras_still_needs_the_symbolic_build_fix(workers):
    _, reports, _ = workers

    for report in reports:
        error = report["defects"]["symbolic_build"]
        if error is None:
            pytest.fail(
                "keras-team/keras#20585 no longer reproduces with this Keras: fit "
                "under MultiWorkerMirroredStrategy works without keras_scaling's "
                "fix, so the symbolic_build fix can be dropped"
            )
        assert "PerReplica" in error and "unsupported type" in error, error


def test_keras_still_needs_the_scalar_reduce_fix(workers):
    _, reports, _ = workers

    for report in reports:
        error = report["defects"]["scalar_reduce"]
        if error is None:
            pytest.fail(
                "tensorflow/tensorflow#72388 no longer reproduces with this "
                "Keras and TensorFlow: scalar metrics reduce under "
                "MultiWorkerMirroredStrategy without keras_scaling's fix, so the "
                "scalar_reduce fix can be dropped"
            )
        assert "Invalid reduction dimension 0" in error, error


def test_fit_on_worker_shares_runs_the_planned_steps_every_epoch(workers):
    _, reports, _ = workers

    for report in reports:
        # auto_strategy() applied it: the data comes from keras_scaling.data.
        assert "multi_worker_epoch" in report["active_fixes"]
        shares = report["worker_shares"]
        # One batch of the global size lasts NUM_WORKERS steps on its worker.
        assert shares["planned_steps"] == NUM_WORKERS * shares["batches"]
        assert shares["fit_steps_per_epoch"] == [shares["planned_steps"]] * EPOCHS
        assert shares["fit_announced_steps"] == shares["planned_steps"]
        # Every sample once per epoch, over both workers; padding weighs 0.
        if not metric_values_are_right(workers[0]):
            continue
        history = shares["fit_history"]
        for prefix in ("", "val_"):
            assert history[f"{prefix}weighted_count"] == [NUM_IDS] * EPOCHS
            assert history[f"{prefix}weighted_id_sum"] == [sum(range(NUM_IDS))] * EPOCHS


def test_evaluate_on_padded_data_counts_every_sample_exactly_once(workers):
    out_dir, reports, _ = workers
    if not metric_values_are_right(out_dir):
        return

    for report in reports:
        evaluate = report["worker_shares"]["evaluate"]
        assert evaluate["weighted_count"] == NUM_IDS
        assert evaluate["weighted_id_sum"] == sum(range(NUM_IDS))
        assert evaluate["loss"] == 0


def test_evaluate_counts_a_dataset_split_between_workers_by_hand(workers):
    out_dir, reports, _ = workers
    if not metric_values_are_right(out_dir):
        return

    for report in reports:
        batch = report["worker_shares"]["global_batch_size"]
        # Worker w keeps ids w, w + 2, ... and whole batches of them.
        rows_per_worker = NUM_IDS // NUM_WORKERS // batch * batch
        kept = [
            i
            for worker in range(NUM_WORKERS)
            for i in list(range(worker, NUM_IDS, NUM_WORKERS))[:rows_per_worker]
        ]
        evaluate = report["worker_shares"]["evaluate_own_shards"]
        assert evaluate["weighted_count"] == len(kept)
        assert evaluate["weighted_id_sum"] == sum(kept)


def test_predict_returns_the_rows_of_every_worker_once_on_each_worker(workers):
    _, reports, _ = workers

    for report in reports:
        shares = report["worker_shares"]
        # Every step gathers the rows of all replicas of all workers.
        assert len(shares["predict"]) == shares["planned_steps"] * shares["global_batch_size"]
        # The model is y = x on the ids; the padding rows repeat row 0.
        expected = collections.Counter(range(NUM_IDS))
        expected[0] += shares["samples_padded"]
        assert collections.Counter(shares["predict"]) == expected
    assert reports[0]["worker_shares"]["predict"] == reports[1]["worker_shares"]["predict"]


def test_fit_builds_and_trains_on_bool_int_and_string_inputs(workers):
    out_dir, reports, _ = workers

    for report in reports:
        run = report["input_dtypes"]
        assert run["iterations"] == 2 * run["planned_steps"]
        assert all(np.isfinite(run["loss"]))
    weight_files = sorted(out_dir.glob("worker0_dtypes_weight*.npy"))
    # Two embeddings and the dense layer's kernel and bias.
    assert len(weight_files) == 4
    for worker0_file in weight_files:
        worker1_file = out_dir / worker0_file.name.replace("worker0", "worker1")
        np.testing.assert_array_equal(np.load(worker0_file), np.load(worker1_file))


def test_keras_still_needs_the_multi_worker_epoch_fix(workers):
    _, reports, _ = workers

    for report in reports:
        shares = report["worker_shares"]
        steps = report["defects"]["multi_worker_epoch"]
        if steps == [shares["planned_steps"]]:
            pytest.fail(
                "Keras now runs the whole epoch of a dataset with "
                "AutoShardPolicy.OFF under MultiWorkerMirroredStrategy without "
                "keras_scaling's fix, so the multi_worker_epoch fix can be dropped"
            )
        # Keras counts one step per batch of this worker's dataset, and runs
        # whole executions of 3 steps while the data lasts.
        executions = math.ceil(shares["batches"] / SHARES_STEPS_PER_EXECUTION)
        expected = min(executions * SHARES_STEPS_PER_EXECUTION, shares["planned_steps"])
        assert steps == [expected] and expected < shares["planned_steps"], steps
