"""`auto_strategy()` on the cluster forms it cannot train, before any strategy.

In-process: a Slurm cluster it cannot build and a `TF_CONFIG` with parameter
servers fail, naming the fix, before TensorFlow builds a strategy; an
evaluator its `TF_CONFIG` leaves out of the cluster gets a strategy of its
own; a Slurm task keeps the GPUs bound to it. Real Slurm jobs are in
tests/cluster/ (`make test-cluster`).
"""

import json
import logging
import os
import socket

import pytest

import keras_scaling
from keras_scaling import cluster
from keras_scaling.cluster import _tensorflow as _cluster_tf


def _step_env(monkeypatch, **overrides):
    """The environment of task 0 of a 2-task Slurm step on gpu[01-02]."""
    for name in (
        "TF_CONFIG",
        "KERAS_SCALING_WORKER_HOSTS",
        "KERAS_SCALING_PORT",
        "SLURM_GPUS_PER_TASK",
        "SLURM_GPUS_ON_NODE",
        "SLURM_JOB_GPUS",
    ):
        monkeypatch.delenv(name, raising=False)
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "gpu[01-02]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURMD_NODENAME": "gpu01",
        "SLURM_LOCALID": "0",
        "SLURM_PROCID": "0",
    }
    env.update(overrides)
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


def test_auto_strategy_in_a_batch_script_of_two_tasks_names_srun(monkeypatch):
    _step_env(monkeypatch, SLURM_STEP_ID=None)
    with pytest.raises(cluster.NotInStepError, match="srun python train.py"):
        keras_scaling.auto_strategy()


def test_auto_strategy_names_a_slurm_node_that_does_not_resolve(monkeypatch):
    real_getaddrinfo = socket.getaddrinfo

    def resolve_only_gpu01(host, *args, **kwargs):
        # The machine's resolver answers for gpu01 only; no lookup leaves it.
        if host == "gpu01":
            return real_getaddrinfo("127.0.0.1", *args, **kwargs)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", resolve_only_gpu01)
    _step_env(monkeypatch)
    with pytest.raises(ValueError, match="the node name 'gpu02' of SLURM_STEP_NODELIST"):
        keras_scaling.auto_strategy()


def test_auto_strategy_names_keras_scaling_port_when_the_port_is_taken(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        _step_env(
            monkeypatch,
            KERAS_SCALING_PORT=str(port),
            SLURM_STEP_NODELIST="localhost",
            SLURM_STEP_TASKS_PER_NODE="2",
            SLURMD_NODENAME="localhost",
        )
        with pytest.raises(ValueError, match=f"port {port} .*Set KERAS_SCALING_PORT"):
            keras_scaling.auto_strategy()


def _tf_config_env(monkeypatch, config):
    for name in ("KERAS_SCALING_WORKER_HOSTS", "KERAS_SCALING_CPU_DEVICES", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))


def test_auto_strategy_on_an_evaluator_left_out_of_its_cluster_evaluates_alone(monkeypatch, caplog):
    # Kubeflow's TFJob: the evaluator's cluster lists the chief and workers only.
    _tf_config_env(
        monkeypatch,
        {
            "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
            "task": {"type": "evaluator", "index": 0},
        },
    )
    with caplog.at_level(logging.INFO, logger="keras_scaling"):
        strategy = keras_scaling.auto_strategy()
    info = keras_scaling.describe_strategy(strategy)
    assert info.kind != "MultiWorkerMirroredStrategy"
    assert info.num_workers == 1
    assert "evaluator, which evaluates alone" in caplog.text
    assert "outside the training cluster" in caplog.text


# Before it was refused, the chief and the workers waited for the ps tasks
# without end; the thread method ends even a wait inside TensorFlow.
@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize("task_type", ["chief", "worker", "ps"])
def test_auto_strategy_refuses_parameter_servers_on_every_task(monkeypatch, task_type):
    _tf_config_env(
        monkeypatch,
        {
            "cluster": {
                "chief": ["127.0.0.1:1"],
                "worker": ["127.0.0.1:2"],
                "ps": ["127.0.0.1:3"],
            },
            "task": {"type": task_type, "index": 0},
        },
    )
    with pytest.raises(ValueError, match="all-reduce.*tf.distribute.ParameterServerStrategy"):
        keras_scaling.auto_strategy()


def test_auto_strategy_in_a_batch_script_of_two_nodes_names_srun(monkeypatch):
    # sbatch --nodes=2, no --ntasks: Slurm sets no SLURM_NTASKS.
    _step_env(
        monkeypatch,
        SLURM_STEP_ID=None,
        SLURM_NTASKS=None,
        SLURM_STEP_NUM_TASKS=None,
        SLURM_STEP_NODELIST=None,
        SLURM_STEP_TASKS_PER_NODE=None,
        SLURM_JOB_NODELIST="gpu[01-02]",
        SLURM_NNODES="2",
        SLURM_TASKS_PER_NODE="1(x2)",
    )
    with pytest.raises(cluster.NotInStepError, match="has 2 tasks.*srun python train.py"):
        keras_scaling.auto_strategy()


@pytest.mark.parametrize(
    ("visible", "local_rank", "gpu_bind"),
    [("1", 1, None), ("1", 1, "single:1"), ("2,3", 1, "mask_gpu:0x3,0xC"), ("2,3", 1, None)],
)
def test_a_slurm_task_bound_to_its_gpus_keeps_every_one(monkeypatch, visible, local_rank, gpu_bind):
    _step_env(
        monkeypatch,
        SLURM_STEP_TASKS_PER_NODE="2",
        SLURM_STEP_NODELIST="gpu01",
        SLURM_LOCALID=str(local_rank),
        CUDA_VISIBLE_DEVICES=visible,
        SLURM_STEP_GPUS="0,1,2,3" if "," in visible else "0,1",
        SLURM_GPU_BIND=gpu_bind,
    )
    spec = cluster.resolve_cluster()
    assert (spec.local_rank, spec.tasks_on_node) == (local_rank, 2)
    _cluster_tf.bind_task_gpus(spec)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == visible


def test_a_slurm_task_sharing_the_nodes_gpus_takes_its_share(monkeypatch):
    _step_env(
        monkeypatch,
        SLURM_STEP_TASKS_PER_NODE="2",
        SLURM_STEP_NODELIST="gpu01",
        SLURM_LOCALID="1",
        CUDA_VISIBLE_DEVICES="0,1,2,3",
        SLURM_STEP_GPUS="0,1,2,3",
        SLURM_GPU_BIND=None,
    )
    _cluster_tf.bind_task_gpus(cluster.resolve_cluster())
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
