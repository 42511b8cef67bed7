"""`auto_strategy()` refuses a Slurm cluster it cannot build, naming the fix, before any strategy.

In-process: each case fails before TensorFlow builds a strategy. Real Slurm
jobs are in tests/cluster/ (`make test-cluster`).
"""

import socket

import pytest

import keras_scaling
from keras_scaling import cluster


def _step_env(monkeypatch, **overrides):
    """The environment of task 0 of a 2-task Slurm step on gpu[01-02]."""
    for name in ("TF_CONFIG", "KERAS_SCALING_WORKER_HOSTS", "KERAS_SCALING_PORT"):
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
