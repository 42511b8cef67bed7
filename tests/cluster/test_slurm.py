"""Training under a real Slurm: `sbatch` jobs of 2 tasks on the throw-away cluster.

`keras_scaling.auto_strategy()` inside `srun` builds a
`MultiWorkerMirroredStrategy` over the step's tasks from Slurm's variables
alone (no `TF_CONFIG`); the preemption example `examples/slurm/` is
SIGTERMed by `scancel --signal=TERM`, requeues itself and ends bitwise equal
to a job never stopped. Every job runs on this host's node, on 127.0.0.1.
"""

import json
import os
import re
import socket
import time

import numpy as np
import pytest
from common import MULTI_WORKER_TESTS, REPO, job_env, read, write_script

from keras_scaling.cluster._hostlist import expand_hostlist_python

JOB_TIMEOUT_S = 300

pytestmark = pytest.mark.timeout(3 * JOB_TIMEOUT_S)


def _details(path, slurm, job_id):
    return f"job {job_id}: {slurm.job_state(job_id)}\n--- output ---\n{read(path)[-6000:]}"


def _run_job(slurm, tmp_path, name, body, timeout_s=JOB_TIMEOUT_S, **env):
    """Submits a batch script, waits for it to end; returns (state fields, output)."""
    script = write_script(tmp_path / f"{name}.sbatch", body)
    output = tmp_path / f"{name}.out"
    job_id = slurm.sbatch(["--output", str(output), "--chdir", REPO, script], env=job_env(**env))
    fields = slurm.wait_for_job(job_id, timeout_s)
    return fields, read(output), job_id


# --- host lists --------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "gpu[01-04,07]",
        "node[1-2],login3",
        "r[1-2]n[01-02]",
        "node[009-011],x",
        "a[1-2]b[1-2]c[1-2]",
        "r[1-3]-n[01-02].s[8-10]",
        "a[1,3]b[2-3]c[1,5-6]d[1-2]e[01-02]",
        "n[1-2] m[3-4]\tlogin3, gpu[01-02]",
    ],
)
def test_python_host_list_expander_agrees_with_scontrol(slurm, text):
    result = slurm.run(["scontrol", "show", "hostnames", text])
    assert expand_hostlist_python(text) == result.stdout.split()


# --- 2 tasks of one step: the multi-worker test's worker, under sbatch -------


@pytest.fixture(scope="module")
def trained(slurm, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("trained")
    out_dir, log_dir = tmp_path / "out", tmp_path / "logs"
    out_dir.mkdir()
    worker = os.path.join(MULTI_WORKER_TESTS, "mw_train_worker.py")
    fields, output, job_id = _run_job(
        slurm,
        tmp_path,
        "train",
        f'#SBATCH --ntasks=2\nsrun --kill-on-bad-exit=1 "$PYTHON" {worker} --out-dir {out_dir} --log-dir {log_dir}\n',
        KERAS_SCALING_CPU_DEVICES="2",
    )
    assert fields["JobState"] == "COMPLETED", output[-6000:]
    workers = []
    for index in (0, 1):
        with open(out_dir / f"worker{index}.json") as file:
            workers.append(json.load(file))
    return {"job_id": job_id, "out_dir": out_dir, "log_dir": log_dir, "workers": workers}


def test_srun_tasks_form_one_cluster_of_two_workers_with_no_tf_config(trained):
    for index, worker in enumerate(trained["workers"]):
        assert worker["worker_index"] == index
        assert worker["num_workers"] == 2
        assert worker["num_replicas"] == 4  # 2 tasks x 2 logical CPUs
        assert worker["is_chief"] == (index == 0)


def test_srun_tasks_train_every_sample_exactly_once_per_epoch(trained):
    workers = trained["workers"]
    for epoch in ("0", "1"):
        ids = [worker["ids_by_epoch"][epoch] for worker in workers]
        assert len(ids[0]) == len(set(ids[0])) == 48
        assert len(ids[1]) == len(set(ids[1])) == 48
        assert set(ids[0]) | set(ids[1]) == set(range(96))


def test_srun_tasks_end_with_bitwise_equal_weights(trained):
    copies = [np.load(trained["out_dir"] / f"worker{i}_weights.npz") for i in (0, 1)]
    assert sorted(copies[0].files) == sorted(copies[1].files)
    kernels = [name for name in copies[0].files if "kernel" in name]
    assert kernels
    for name in copies[0].files:
        assert copies[0][name].tobytes() == copies[1][name].tobytes(), name
    # Trained: the weights left their initial values the same way on both.
    assert trained["workers"][0]["iterations"] == 2 * 6


def test_srun_tasks_write_replica_sync_and_throughput_from_the_chief(trained):
    from keras_scaling.summaries import _tensorboard

    scalars = _tensorboard.read_scalars(_tensorboard.run_dir(str(trained["log_dir"])))
    throughput_tags = [tag for tag in scalars if "samples_per_sec" in tag]
    assert throughput_tags, sorted(scalars)
    events = [
        name
        for name in os.listdir(_tensorboard.run_dir(str(trained["log_dir"])))
        if name.startswith("events.out.tfevents")
    ]
    pids = {int(re.search(r"\.(\d+)\.\d+(?:\.v2)?$", name).group(1)) for name in events}
    assert pids == {trained["workers"][0]["pid"]}


# --- errors naming the fix ---------------------------------------------------


_AUTO_STRATEGY = "import keras_scaling; keras_scaling.auto_strategy()"


def test_batch_script_running_python_directly_on_two_tasks_fails_naming_srun(slurm, tmp_path):
    fields, output, _ = _run_job(
        slurm, tmp_path, "direct", f'#SBATCH --ntasks=2\n"$PYTHON" -c "{_AUTO_STRATEGY}"\n'
    )
    assert fields["JobState"] == "FAILED", output[-4000:]
    assert "NotInStepError" in output
    assert "srun python train.py" in output


def test_port_in_use_fails_naming_keras_scaling_port(slurm, tmp_path):
    holders = []
    try:
        # Both tasks' ports taken (local rank r uses KERAS_SCALING_PORT + r),
        # so neither waits for the other.
        for _ in range(20):
            first = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            first.bind(("", 0))
            port = first.getsockname()[1]
            second = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                second.bind(("", port + 1))
            except OSError:
                first.close()
                second.close()
                continue
            holders = [first, second]
            for sock in holders:
                sock.listen()
            break
        assert holders, "no two neighbouring free ports"
        fields, output, _ = _run_job(
            slurm,
            tmp_path,
            "port",
            f'#SBATCH --ntasks=2\nsrun --kill-on-bad-exit=1 "$PYTHON" -c "{_AUTO_STRATEGY}"\n',
            KERAS_SCALING_PORT=str(port),
        )
    finally:
        for sock in holders:
            sock.close()
    assert fields["JobState"] == "FAILED", output[-4000:]
    assert f"this task's port {port} " in output
    assert "is in use" in output and "Set KERAS_SCALING_PORT" in output


# --- the preemption example: SIGTERM, requeue, resume ------------------------


def _submit_example(slurm, tmp_path, name):
    output = tmp_path / f"{name}.out"
    job_id = slurm.sbatch(
        [
            "--output",
            str(output),
            "--chdir",
            REPO,
            # The example's --time is an hour: here, SIGTERM comes from scancel.
            os.path.join(REPO, "examples", "slurm", "train.sbatch"),
        ],
        env=job_env(SHARED_DIR=str(tmp_path / name)),
    )
    return job_id, output


def _wait_for_text(path, text, slurm, job_id, timeout_s=JOB_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while text not in read(path):
        state = slurm.job_state(job_id).get("JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), _details(path, slurm, job_id)
        assert time.monotonic() < deadline, f"no {text!r}\n{_details(path, slurm, job_id)}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def preemption(slurm, tmp_path_factory):
    """A job never stopped, and the same job SIGTERMed in epoch 2 of 3, requeued, finished."""
    tmp_path = tmp_path_factory.mktemp("preemption")
    reference_id, reference_out = _submit_example(slurm, tmp_path, "reference")
    preempted_id, preempted_out = _submit_example(slurm, tmp_path, "preempted")

    # In the second of 3 epochs (128 steps each), as a preemption would.
    _wait_for_text(preempted_out, "Epoch 2/3", slurm, preempted_id)
    slurm.run(["scancel", "--signal=TERM", str(preempted_id)])
    # The batch script requeues the job on status 75; Slurm starts it again
    # when the old run's credentials expire (cred_expire, 10 s here).
    reference = slurm.wait_for_job(reference_id, JOB_TIMEOUT_S)
    assert reference["JobState"] == "COMPLETED", _details(reference_out, slurm, reference_id)
    preempted = slurm.wait_for_job(preempted_id, JOB_TIMEOUT_S)
    assert preempted["JobState"] == "COMPLETED", _details(preempted_out, slurm, preempted_id)
    return {"tmp_path": tmp_path, "state": preempted, "output": read(preempted_out)}


def test_scancel_sigterm_makes_every_task_save_at_one_step_and_exit_75(preemption):
    output = preemption["output"]
    saved = re.findall(r"saved a backup at optimizer step (\d+)", output)
    assert len(saved) == 2, output[-6000:]  # the chief's notice and the other task's
    assert saved[0] == saved[1]
    assert 128 < int(saved[0]) < 3 * 128  # in epoch 2 or 3, not at the start
    assert _tasks_exited_with(output, 75) == [0, 1], output[-6000:]


def _tasks_exited_with(output, status):
    """The task ids srun reports as exited with ``status``, sorted.

    srun names tasks that exit together in one line ("tasks 0-1: Exited with
    exit code 75") and tasks that exit apart in one line each ("task 1: ...").
    """
    tasks = []
    pattern = rf"srun: error: \S+: tasks? ([\d,-]+): Exited with exit code {status}\b"
    for spec in re.findall(pattern, output):
        for part in spec.split(","):
            first, _, last = part.partition("-")
            tasks.extend(range(int(first), int(last or first) + 1))
    return sorted(tasks)


def test_preempted_job_requeues_itself_and_finishes_from_the_saved_step(preemption):
    output = preemption["output"]
    assert preemption["state"]["Restarts"] == "1"
    assert "run 2, shared dir" in output
    assert "cluster from Slurm job" in output
    assert f"finished: {3 * 128} optimizer steps" in output
    # The backup is deleted when training ends normally.
    assert not os.path.exists(preemption["tmp_path"] / "preempted" / "backup" / "backup.npz")


def test_resumed_job_ends_bitwise_equal_to_a_job_never_stopped(preemption):
    tmp_path = preemption["tmp_path"]
    with (
        np.load(tmp_path / "reference" / "final.weights.npz") as expected,
        np.load(tmp_path / "preempted" / "final.weights.npz") as resumed,
    ):
        assert expected.files == resumed.files
        for name in expected.files:
            assert resumed[name].tobytes() == expected[name].tobytes(), name
