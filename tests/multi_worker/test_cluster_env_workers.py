"""The environments of Kubernetes pods and Vertex AI tasks, run as local processes on 127.0.0.1.

Each test starts the worker processes itself with the variables a pod or a
task would get (no `keras-scaling launch`, no `TF_CONFIG` written by us for
the Kubernetes case), each bounded by a timeout, and reads back what every
worker wrote: `tests/multi_worker/mw_train_worker.py` trains with
`keras_scaling.auto_strategy()`, `data.distribute`, `ReplicaSyncCheck` and
`ThroughputLogger`. What an evaluator's or a parameter server cluster's
`TF_CONFIG` makes of `auto_strategy()` starts no server: this process asks,
under each in turn.
"""

import io
import json
import logging
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import keras_scaling

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_WORKER = os.path.join(HERE, "mw_train_worker.py")
TIMEOUT_S = 240

pytestmark = pytest.mark.timeout(2 * TIMEOUT_S + 60)


def _base_env():
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SLURM_", "KERAS_SCALING_", "JOB_COMPLETION_INDEX"))
    }
    env.pop("TF_CONFIG", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _consecutive_free_ports(count):
    """`count` consecutive ports free on 127.0.0.1, found by binding them."""
    for _ in range(50):
        sockets = []
        try:
            first = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(first)
            first.bind(("127.0.0.1", 0))
            base = first.getsockname()[1]
            if base + count > 65535:
                continue
            for port in range(base + 1, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return list(range(base, base + count))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


def _run_together(envs, args, timeout_s=TIMEOUT_S):
    """Runs one process per env at once; returns [(returncode, stdout, stderr)]."""
    processes = [
        subprocess.Popen(
            [sys.executable, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env in envs
    ]
    results = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=timeout_s)
            results.append((process.returncode, out, err))
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
        outputs = [process.communicate() for process in processes]
        pytest.fail(
            f"workers did not finish within {timeout_s} s:\n"
            + "\n".join(err[-3000:] for _, err in outputs)
        )
    return results


def _train(tmp_path, envs):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    results = _run_together(
        envs, [TRAIN_WORKER, "--out-dir", str(out_dir), "--log-dir", str(tmp_path / "logs")]
    )
    for returncode, _, err in results:
        assert returncode == 0, err[-6000:]
    workers = []
    for index in range(len(envs)):
        with open(out_dir / f"worker{index}.json") as file:
            workers.append(json.load(file))
    weights = [np.load(out_dir / f"worker{index}_weights.npz") for index in range(len(envs))]
    return workers, weights, [err for _, _, err in results]


def _assert_same_weights(weights):
    names = sorted(weights[0].files)
    assert any("kernel" in name for name in names)
    for other in weights[1:]:
        assert sorted(other.files) == names
        for name in names:
            assert other[name].tobytes() == weights[0][name].tobytes(), name


def _assert_every_sample_once_per_epoch(workers, num_samples=96):
    for epoch in ("0", "1"):
        ids = [worker["ids_by_epoch"][epoch] for worker in workers]
        assert sum(len(worker_ids) for worker_ids in ids) == num_samples
        assert set().union(*ids) == set(range(num_samples))


def test_indexed_job_pods_from_a_worker_host_template_train_one_model(tmp_path):
    first, _ = _consecutive_free_ports(2)
    # What the manifest sets in every pod; the Indexed Job sets the index.
    template = f"127.0.0.1:[{first}-{first + 1}]"
    envs = [
        {**_base_env(), "KERAS_SCALING_WORKER_HOSTS": template, "JOB_COMPLETION_INDEX": str(i)}
        for i in (0, 1)
    ]
    workers, weights, _ = _train(tmp_path, envs)
    assert [worker["worker_index"] for worker in workers] == [0, 1]
    assert [worker["num_workers"] for worker in workers] == [2, 2]
    assert [worker["is_chief"] for worker in workers] == [True, False]
    _assert_every_sample_once_per_epoch(workers)
    _assert_same_weights(weights)


def test_vertex_chief_and_worker_tf_config_train_one_model(tmp_path):
    chief_port, worker_port = _consecutive_free_ports(2)
    cluster = {
        "chief": [f"127.0.0.1:{chief_port}"],
        "worker": [f"127.0.0.1:{worker_port}"],
        # Vertex AI names an evaluator too; it does not join the training.
        "evaluator": ["127.0.0.1:1"],
    }
    envs = [
        {**_base_env(), "TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}
        for task in ({"type": "chief", "index": 0}, {"type": "worker", "index": 0})
    ]
    workers, weights, _ = _train(tmp_path, envs)
    # The chief is worker 0 and writes the logs; the worker follows it.
    assert [worker["worker_index"] for worker in workers] == [0, 1]
    assert [worker["is_chief"] for worker in workers] == [True, False]
    assert [worker["num_replicas"] for worker in workers] == [2, 2]
    _assert_every_sample_once_per_epoch(workers)
    _assert_same_weights(weights)


_DESCRIBE = """
import json, logging, os, keras_scaling
logging.basicConfig(level=logging.INFO)
info = keras_scaling.describe_strategy(keras_scaling.auto_strategy())
print(json.dumps({"kind": info.kind, "num_workers": info.num_workers,
                  "is_chief": info.is_chief, "cluster_origin": info.cluster_origin}), flush=True)
# Skips TensorFlow's shutdown: the answer is printed.
os._exit(0)
"""

_EVALUATOR_IN_ITS_CLUSTER = {
    "cluster": {
        "chief": ["127.0.0.1:1"],
        "worker": ["127.0.0.1:2"],
        "evaluator": ["127.0.0.1:3"],
    },
    "task": {"type": "evaluator", "index": 0},
}
# Kubeflow's TFJob and AI Platform: the evaluator's TF_CONFIG lists the
# training cluster only.
_EVALUATOR_OUTSIDE_ITS_CLUSTER = {
    "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
    "task": {"type": "evaluator", "index": 0},
}
_PARAMETER_SERVER_TASKS = [
    {"type": "chief", "index": 0},
    {"type": "worker", "index": 0},
    {"type": "ps", "index": 0},
]


def _describe_here():
    """`describe_strategy(auto_strategy())` in this process, as `TF_CONFIG` now says.

    Returns (the fields of `_DESCRIBE`'s JSON, or {"error": "..."}, what
    keras_scaling logged at level INFO and above). None of the `TF_CONFIG`s
    given to it starts a server: the evaluators train alone, and the refusal
    of a parameter server comes before any network wait.
    """
    logs = io.StringIO()
    handler = logging.StreamHandler(logs)
    logger = logging.getLogger("keras_scaling")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        info = keras_scaling.describe_strategy(keras_scaling.auto_strategy())
        found = {
            "kind": info.kind,
            "num_workers": info.num_workers,
            "is_chief": info.is_chief,
            "cluster_origin": info.cluster_origin,
        }
    except Exception as error:  # the test reads which
        found = {"error": f"{type(error).__name__}: {error}"}
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return found, logs.getvalue()


@pytest.fixture(scope="module")
def described():
    """`[(_describe_here()'s info, its logs)]` for each task below, in order, in this process.

    The evaluator in its cluster, the evaluator outside it, then the chief,
    the worker and the ps task of a cluster with a parameter server.
    """
    chief, worker, ps = (f"127.0.0.1:{port}" for port in _consecutive_free_ports(3))
    cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
    configs = [_EVALUATOR_IN_ITS_CLUSTER, _EVALUATOR_OUTSIDE_ITS_CLUSTER]
    configs += [{"cluster": cluster, "task": task} for task in _PARAMETER_SERVER_TASKS]
    found = []
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(("SLURM_", "KERAS_SCALING_", "JOB_COMPLETION_INDEX")):
                patch.delenv(name)
        for config in configs:
            patch.setenv("TF_CONFIG", json.dumps(config))
            found.append(_describe_here())
    return found


def test_evaluator_task_trains_alone_and_says_why(described):
    info, err = described[0]
    assert "error" not in info, err[-4000:]
    assert info["kind"] != "MultiWorkerMirroredStrategy"
    assert info["num_workers"] == 1
    assert info["cluster_origin"].endswith("this is evaluator 0")
    assert "makes this task the evaluator, which evaluates alone" in err


def test_evaluator_left_out_of_its_cluster_evaluates_alone(described):
    info, err = described[1]
    assert "error" not in info, err[-4000:]
    assert info["kind"] != "MultiWorkerMirroredStrategy"
    assert info["num_workers"] == 1
    assert info["cluster_origin"].endswith("this is evaluator 0, outside the training cluster")
    assert "makes this task the evaluator, which evaluates alone" in err


def test_tf_config_with_parameter_servers_fails_on_every_task_naming_the_strategy(described):
    for info, err in described[2:]:
        error = info.get("error", "")
        assert error.startswith("ValueError: TF_CONFIG names a parameter server"), (info, err)
        assert "trains with all-reduce" in error
        assert "tf.distribute.ParameterServerStrategy" in error


def test_pods_given_a_worker_list_separated_by_spaces_form_one_cluster(tmp_path):
    first, second = _consecutive_free_ports(2)
    # As a YAML list ends up in one variable, the same in every pod.
    hosts = f"127.0.0.1:{first} 127.0.0.1:{second}"
    envs = [
        {**_base_env(), "KERAS_SCALING_WORKER_HOSTS": hosts, "JOB_COMPLETION_INDEX": str(i)}
        for i in (0, 1)
    ]
    results = _run_together(envs, ["-c", _DESCRIBE])
    infos = []
    for returncode, out, err in results:
        assert returncode == 0, err[-4000:]
        infos.append(json.loads(out.strip().splitlines()[-1]))
    assert [info["kind"] for info in infos] == ["MultiWorkerMirroredStrategy"] * 2
    assert [info["num_workers"] for info in infos] == [2, 2]
    assert [info["is_chief"] for info in infos] == [True, False]
