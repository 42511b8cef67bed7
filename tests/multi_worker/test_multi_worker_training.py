"""Training on 2 workers x 2 logical CPUs (4 replicas), started by `keras-scaling launch`.

The tests launch real worker processes on 127.0.0.1 (the scripts beside
this file), bounded by a timeout, and read back what every worker wrote.
Several tests read one launch whose workers run their scenarios in turn
(`mw_scenarios_worker.py`): each start of TensorFlow costs seconds of CPU.
"""

import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "workers"))
import data_wrapping_sources as sources  # noqa: E402

LAUNCH_TIMEOUT_S = 180

pytestmark = pytest.mark.timeout(2 * LAUNCH_TIMEOUT_S + 60)


def worker_env():
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("KERAS_SCALING_CPU_DEVICES", None)
    return env


def is_running(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def kill_recorded_workers(out_dir):
    """Kills any worker process still running, from the pids the workers recorded."""
    left = []
    for path in glob.glob(os.path.join(out_dir, "*.pid")):
        pid = int(open(path).read())
        if is_running(pid):
            left.append(pid)
            os.kill(pid, signal.SIGKILL)
    return left


def run_command(command, cwd=REPO, timeout_s=LAUNCH_TIMEOUT_S):
    """Runs `command`; on timeout stops it the way Ctrl-C would, then kills it."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # The launcher stops its workers on SIGTERM; SIGKILL only the launcher.
        process.send_signal(signal.SIGTERM)
        try:
            out, err = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        pytest.fail(
            f"{shlex.join(command)} did not finish within {timeout_s} s\n"
            f"stdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
        )
    return process.returncode, out, err


def launch(script, *script_args, workers=2, cpu_devices=2, timeout_s=LAUNCH_TIMEOUT_S):
    command = [
        sys.executable,
        "-m",
        "keras_scaling",
        "launch",
        "--workers",
        str(workers),
        "--cpu-devices",
        str(cpu_devices),
        "--grace-period",
        "2",
        "--",
        sys.executable,
        os.path.join(HERE, script),
        *script_args,
    ]
    return run_command(command, timeout_s=timeout_s)


def read_json(path):
    with open(path) as file:
        return json.load(file)


def details(returncode, out, err):
    return f"exit status {returncode}\nstdout:\n{out[-4000:]}\nstderr:\n{err[-6000:]}"


def scalar_events(log_dir, tag):
    """(step, value) of `tag` in keras_scaling's run directory of `log_dir`."""
    from keras_scaling.summaries import _tensorboard

    return _tensorboard.read_scalars(_tensorboard.run_dir(log_dir)).get(tag, [])


def event_files(log_dir):
    from keras_scaling.summaries import _tensorboard

    pattern = os.path.join(_tensorboard.run_dir(log_dir), "events.out.tfevents.*")
    return sorted(glob.glob(pattern))


def writer_pid(event_file):
    # events.out.tfevents.<time>.<host>.<pid>.<n>, with ".v2" from TensorFlow
    return int(re.search(r"\.(\d+)\.\d+(?:\.v2)?$", event_file).group(1))


# --- one launch, its scenarios in turn (mw_scenarios_worker.py) --------------


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """The output directory and stdout of one launch that ran every scenario to the end."""
    out_dir = str(tmp_path_factory.mktemp("scenarios"))
    data_dir = str(tmp_path_factory.mktemp("wrapping_data"))
    sources.write_all(data_dir)
    try:
        returncode, out, err = launch(
            "mw_scenarios_worker.py", out_dir, data_dir, timeout_s=2 * LAUNCH_TIMEOUT_S
        )
    finally:
        left = kill_recorded_workers(out_dir)
    assert returncode == 0, details(returncode, out, err)
    assert not left, f"worker processes {left} outlived the launcher"
    return out_dir, out


def scenario_reports(scenarios, name):
    out_dir, _ = scenarios
    return [read_json(os.path.join(out_dir, name, f"worker{i}.json")) for i in (0, 1)]


# --- fit and evaluate on 2 workers, with the adapter and both callbacks ------


@pytest.fixture(scope="module")
def trained(scenarios):
    out_dir = os.path.join(scenarios[0], "train")
    workers = scenario_reports(scenarios, "train")
    return {"out_dir": out_dir, "log_dir": os.path.join(out_dir, "logs"), "workers": workers}


def test_two_workers_with_two_cpus_each_make_four_replicas(trained):
    for index, worker in enumerate(trained["workers"]):
        assert worker["worker_index"] == index
        assert worker["num_workers"] == 2
        assert worker["num_replicas"] == 4
        assert len(worker["local_devices"]) == 2
        assert worker["is_chief"] == (index == 0)


def test_every_worker_trains_on_its_own_share_exactly_once_per_epoch(trained):
    workers = trained["workers"]
    for epoch in ("0", "1"):
        ids_0 = workers[0]["ids_by_epoch"][epoch]
        ids_1 = workers[1]["ids_by_epoch"][epoch]
        assert len(ids_0) == len(set(ids_0)) == 48
        assert len(ids_1) == len(set(ids_1)) == 48
        assert not set(ids_0) & set(ids_1)
        assert set(ids_0) | set(ids_1) == set(range(96))


def test_every_worker_runs_the_same_number_of_steps(trained):
    workers = trained["workers"]
    steps_per_epoch = workers[0]["steps_per_epoch"]
    assert steps_per_epoch == 96 // 16
    for worker in workers:
        assert worker["steps_per_epoch"] == steps_per_epoch
        assert worker["steps_by_epoch"] == {"0": steps_per_epoch, "1": steps_per_epoch}
        assert worker["iterations"] == 2 * steps_per_epoch


def test_every_copy_of_every_weight_is_bitwise_identical_on_both_workers(trained):
    copies = [np.load(os.path.join(trained["out_dir"], f"worker{i}_weights.npz")) for i in (0, 1)]
    assert sorted(copies[0].files) == sorted(copies[1].files)
    paths = {name.split("#")[0] for name in copies[0].files}
    assert any("kernel" in path for path in paths)
    for path in paths:
        reference = copies[0][f"{path}#0"]
        for worker_copies in copies:
            for replica in (0, 1):
                value = worker_copies[f"{path}#{replica}"]
                assert value.tobytes() == reference.tobytes(), (path, replica)


def test_evaluate_counts_every_validation_sample_once_over_both_workers(trained):
    import mw_common

    weights = np.load(os.path.join(trained["out_dir"], "worker0_dense.npz"))
    kernel_1, bias_1, kernel_2, bias_2 = (weights[f"arr_{i}"] for i in range(4))
    x_val, y_val = mw_common.make_data(96 // 2 + 3, seed=1)
    hidden = np.maximum(x_val[:, 1:] @ kernel_1 + bias_1, 0.0)
    expected_mae = float(np.mean(np.abs(hidden @ kernel_2 + bias_2 - y_val)))
    evaluations = [worker["evaluation"] for worker in trained["workers"]]
    assert evaluations[0] == evaluations[1]
    assert evaluations[0]["mae"] == pytest.approx(expected_mae, rel=1e-5)


def test_throughput_is_written_by_the_chief_only(trained):
    log_dir = trained["log_dir"]
    chief_pid = trained["workers"][0]["pid"]
    files = event_files(log_dir)
    assert files, f"no event file under {log_dir}"
    assert {writer_pid(path) for path in files} == {chief_pid}
    summary = read_json(os.path.join(log_dir, "throughput.json"))
    assert summary["num_workers"] == 2
    assert summary["num_replicas"] == 4
    assert summary["global_batch_size"] == 16
    assert summary["samples_per_sec"] > 0
    # The job's throughput: steps of the whole cluster times its global batch.
    assert summary["samples_per_sec"] == pytest.approx(summary["steps_per_sec"] * 16)
    steps = [step for step, _ in scalar_events(log_dir, "throughput/samples_per_sec")]
    assert steps, "no throughput/samples_per_sec events"
    assert steps == sorted(set(steps))
    assert steps[-1] <= trained["workers"][0]["iterations"]


# --- a divergence on one worker stops both ------------------------------------


def test_a_divergence_on_worker_1_stops_both_workers_at_the_same_step(scenarios):
    out = scenarios[1]
    outcomes = scenario_reports(scenarios, "diverge")
    for outcome in outcomes:
        assert outcome["error"] == "ReplicaDivergenceError", outcome
        assert outcome["step"] is not None
    assert outcomes[0]["step"] == outcomes[1]["step"]
    assert outcomes[0]["iterations"] == outcomes[1]["iterations"]
    for index in (0, 1):
        assert f"[worker {index}] ReplicaDivergenceError at step" in out
    # The report names the variable that was changed.
    assert all("kernel" in outcome["message"] for outcome in outcomes)


# --- the advice's input timing: no sample twice, none left out ----------------
# Under MultiWorkerMirroredStrategy only the chief times the input pipeline
# (when ThroughputLogger's efficiency is low). Its timing must not change the
# order the chief's data draws next, or the chief and the other worker would
# disagree on the permutation from then on.

TIMED_SAMPLES = 192
TIMED_EPOCHS = 3


def test_every_sample_is_trained_once_per_epoch_when_the_advice_times_the_input(scenarios):
    workers = scenario_reports(scenarios, "input_timing")

    assert workers[0]["input_timing_calls"] >= 1  # the advice fired on the chief
    assert workers[1]["input_timing_calls"] == 0
    for epoch in map(str, range(TIMED_EPOCHS)):
        ids_0, ids_1 = (worker["ids_by_epoch"][epoch] for worker in workers)
        assert len(ids_0) == len(set(ids_0)) == TIMED_SAMPLES // 2, epoch
        assert len(ids_1) == len(set(ids_1)) == TIMED_SAMPLES // 2, epoch
        assert set(ids_0) | set(ids_1) == set(range(TIMED_SAMPLES)), epoch


# --- ReplicaSyncCheck: every worker gets the same verdict and repair ----------


def test_a_divergence_on_one_worker_gives_every_worker_the_same_verdict_and_repair(scenarios):
    outcomes = scenario_reports(scenarios, "resync")
    for outcome in outcomes:
        assert outcome["healthy"] == []
        assert outcome["diverged"] == ["sequential/dense_1/kernel"]
        # 2 workers x 2 logical CPUs: worker 1's first copy is replica 2.
        assert outcome["replicas"] == [2]
        assert outcome["devices"][0].endswith("/task:1/device:CPU:0")
        assert (outcome["num_workers"], outcome["num_replicas"]) == (2, 4)
    # Both workers stop at the same step: the check at the start of training.
    assert outcomes[0]["raised_at_step"] == outcomes[1]["raised_at_step"] == 0
    # "resync" repairs every worker's copies alike, and training goes on.
    for outcome in outcomes:
        assert outcome["after_resync"] == [] and outcome["steps_after_resync"] == 4


# --- tune on 2 workers: the same decisions, and the all-reduce searched -----


@pytest.fixture(scope="module")
def tuned(scenarios):
    return scenario_reports(scenarios, "tune")


def test_tune_takes_the_same_decisions_on_both_workers_and_the_chief_writes_them(scenarios, tuned):
    from keras_scaling.tune import _decision

    record = tuned[0]["record"]
    # Every figure and every decision is the chief's, on both workers.
    assert tuned[1]["record"] == record
    assert (record["workers"], record["replicas"]) == (2, 4)
    path = os.path.join(scenarios[0], "tune", "logs", "tune.json")
    assert tuned[0]["path"] == path and tuned[1]["path"] is None
    assert read_json(path) == record
    # The search plans its rounds on the times measured so far: one that runs
    # slower (the cores shared with other tests) can carry it a little past.
    assert record["elapsed_s"] <= record["budget_s"] * 1.2
    assert record["start"]["settings"]["strategy"] == {}
    reasons = {trial["knob"]: trial["reason"] for trial in record["trials"]}
    assert "NCCL needs GPUs" in reasons["communication"]
    assert "waiting in the all-reduce" in reasons["jit_compile"]
    assert any("explain's split was left out across workers" in note for note in record["notes"])
    (packing,) = [trial for trial in record["trials"] if trial["knob"] == "bytes_per_pack"]
    assert packing["value"] > 0
    assert packing["rounds"] >= _decision.MIN_ROUNDS or packing["reason"].startswith(
        "not measured"
    ), packing
    # A kept change is the settings tune hands back, for auto_strategy.
    assert set(record["best"]["settings"]["strategy"]) <= {"bytes_per_pack", "communication"}


def test_each_packing_tune_tries_is_the_one_tensorflow_traces_and_keeps_replicas_equal(tuned):
    from keras_scaling.tune import _candidates

    for worker in tuned:
        one_pack, *tried = worker["packings"]
        # Each fit ran under ReplicaSyncCheck, which raises when a copy differs.
        assert one_pack["bytes_per_pack"] == 0 and one_pack["packs"] == [1]
        assert tried
        for packing in tried:
            expected = _candidates.pack_count(packing["sizes"], packing["bytes_per_pack"])
            assert expected > 1
            assert packing["packs"] == [expected], packing


# --- a GAN that steps the optimizers it holds: counted, backed up, resumed ---


def test_a_gan_crashed_on_both_workers_resumes_bitwise_as_if_never_stopped(scenarios):
    workers = scenario_reports(scenarios, "gan")

    for worker in workers:
        # 8 steps per epoch on 4 replicas: crashed after step 5, saved every 2 steps.
        assert worker["backup_step_in_epoch"] == 4, worker
        assert worker["resumed_equals_never_stopped"], worker
        assert worker["generator_steps"] == 16
        assert worker["model_optimizer_steps"] == 0
    assert workers[0]["digest"] == workers[1]["digest"]
    record = read_json(os.path.join(scenarios[0], "gan", "logs", "throughput.json"))
    assert record["num_replicas"] == 4
    assert record["steps_measured"] > 0
    assert record["samples_per_sec"] > 0


# --- mixed precision: a step that overflows on one replica of one worker ---


def test_a_step_that_overflows_on_one_replica_of_worker_1_is_skipped_on_every_replica(scenarios):
    workers = scenario_reports(scenarios, "loss_scale")

    for worker in workers:
        # 6 steps: the first updated nothing and halved the scale.
        assert worker["updates"] == 5, worker
        assert worker["loss_scale"] == 2.0**14, worker
        assert worker["finite"] and worker["replicas_equal"], worker
    assert workers[0]["digest"] == workers[1]["digest"]


# --- the data people already have: every source of data_wrapping_sources ----
# Each is read for one epoch through the strategy and trained on with `fit`;
# each test checks one property over both workers' reports.


@pytest.fixture(scope="module")
def reports(scenarios):
    return scenario_reports(scenarios, "data_wrapping")


def _per_source(reports, name):
    return [report["sources"][name] for report in reports]


@pytest.mark.parametrize("name", list(sources.SOURCES))
def test_every_sample_once_per_epoch_across_two_workers(reports, name):
    ids = [set(result["ids"]) for result in _per_source(reports, name)]
    assert not ids[0] & ids[1], "a sample was read by both workers"
    all_ids = [value for result in _per_source(reports, name) for value in result["ids"]]
    assert sorted(all_ids) == list(range(sources.SOURCES[name][0]))


@pytest.mark.parametrize("name", list(sources.SOURCES))
def test_global_batch_is_split_over_four_replicas(reports, name):
    for result in _per_source(reports, name):
        assert result["per_replica_batch_size"] == sources.SOURCE_BATCH_SIZE
        assert result["global_batch_size"] == 4 * sources.SOURCE_BATCH_SIZE
        assert result["replica_batch_sizes"] == [sources.SOURCE_BATCH_SIZE]


@pytest.mark.parametrize("name", list(sources.SOURCES))
def test_every_worker_runs_the_same_planned_steps(reports, name):
    results = _per_source(reports, name)
    planned = results[0]["planned_steps"]
    assert [result["steps"] for result in results] == [planned, planned]
    assert [result["planned_steps"] for result in results] == [planned, planned]


@pytest.mark.parametrize("name", list(sources.SOURCES))
def test_fit_trains_on_two_workers(reports, name):
    for result in _per_source(reports, name):
        assert result["fit_steps"] == result["fit_planned_steps"] > 0
        assert result["loss"] == result["loss"]  # not NaN


def test_files_and_items_are_split_by_source(reports):
    modes = {
        name: {result["shard_mode"] for result in _per_source(reports, name)}
        for name in sources.SOURCES
    }
    assert modes["image_dataset_from_directory"] == {"file"}
    assert modes["text_dataset_from_directory"] == {"file"}
    assert modes["py_dataset"] == {"item"}
    assert modes["batched_pipeline"] == {"element"}


def test_each_worker_begins_and_ends_its_py_dataset_epochs_in_pairs(reports):
    # One fit epoch per worker, each on its own PyDataset. Under this strategy
    # the model is built from a first batch read beforehand; on data this
    # small that read is a whole pass, so it can count as one more epoch.
    for result in _per_source(reports, "py_dataset"):
        assert result["epochs_begun"] == result["epochs_ended"] in (1, 2)


# --- a killed worker: the launcher stops the others; a relaunch resumes -------


def test_a_killed_worker_stops_the_launch_and_a_relaunch_resumes(tmp_path):
    out_dir, log_dir, backup_dir = (str(tmp_path), str(tmp_path / "logs"), str(tmp_path / "backup"))
    common = ["--out-dir", out_dir, "--log-dir", log_dir, "--backup-dir", backup_dir]
    try:
        returncode, out, err = launch(
            "mw_resume_worker.py", *common, "--run", "1", "--kill-at-epoch", "2"
        )
        returned_at = time.time()
        left = kill_recorded_workers(out_dir)
        assert not left, f"worker processes {left} outlived the launcher"
        assert returncode == 128 + signal.SIGKILL, details(returncode, out, err)
        assert (
            "keras-scaling launch: worker 1 exited with status -9 (killed by "
            "SIGKILL); stopped the others" in err
        ), details(returncode, out, err)
        killed = read_json(os.path.join(out_dir, "killed.json"))
        # Worker 0 is blocked in a collective that cannot complete: it must be
        # stopped, not waited for (TensorFlow's own health check takes longer).
        assert returned_at - killed["time"] < 20
        run_1_steps = scalar_events(log_dir, "throughput/samples_per_sec")

        returncode, out, err = launch("mw_resume_worker.py", *common, "--run", "2")
    finally:
        left = kill_recorded_workers(out_dir)
    assert returncode == 0, details(returncode, out, err)
    assert not left
    runs = [read_json(os.path.join(out_dir, f"run2_worker{i}.json")) for i in (0, 1)]
    steps_per_epoch = runs[0]["steps_per_epoch"]
    assert killed["iterations"] == 2 * steps_per_epoch + 2
    for run in runs:
        assert run["first_epoch"] == 2
        assert run["iterations_at_start"] == 2 * steps_per_epoch
        assert run["iterations_at_end"] == 4 * steps_per_epoch

    tag = "throughput/samples_per_sec"
    all_steps = [step for step, _ in scalar_events(log_dir, tag)]
    assert all_steps == sorted(set(all_steps)), f"steps overlap: {all_steps}"
    # Event files are read in name order, which is the order they were opened.
    run_2_steps = all_steps[len(run_1_steps) :]
    assert run_2_steps, "the resumed run logged no throughput"
    assert min(run_2_steps) > 2 * steps_per_epoch
    assert max(run_2_steps) <= 4 * steps_per_epoch


# --- the README's multi-worker example, run as written -----------------------


def readme_launch_command():
    """The `keras-scaling launch` command of README.md's multi-worker example, or None."""
    with open(os.path.join(REPO, "README.md")) as file:
        lines = file.read().replace("\\\n", " ").splitlines()
    in_code = False
    for line in lines:
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif in_code and line.strip().startswith("keras-scaling launch"):
            if "multi_worker" in line:
                return line.strip()
    return None


def test_the_readme_multi_worker_example_runs_as_written(tmp_path):
    command = readme_launch_command()
    assert command is not None, "README.md has no `keras-scaling launch` example"
    assert "examples/multi_worker.py" in command
    # Run from a copy of the repository's layout, so the logs the example
    # writes (relative paths) land in a temporary directory.
    os.symlink(os.path.join(REPO, "examples"), tmp_path / "examples")
    returncode, out, err = run_command(["bash", "-c", command], cwd=str(tmp_path))
    assert returncode == 0, details(returncode, out, err)
    for index in (0, 1):
        assert f"[worker {index}] MultiWorkerMirroredStrategy: 2 workers, 4 replicas on CPU" in out
    assert re.search(r"\[worker 0\] validation mae: \d", out), out[-3000:]
    logs = glob.glob(str(tmp_path / "**" / "throughput.json"), recursive=True)
    assert len(logs) == 1, logs
    assert read_json(logs[0])["num_replicas"] == 4
