"""Where a multi-worker cluster comes from: `TF_CONFIG`, Kubernetes, Slurm, `launch` (docs/guides/clusters.md)."""

import dataclasses
import json
import os
from collections.abc import Callable, Mapping

from keras_scaling.cluster._hostlist import expand_hostlist
from keras_scaling.cluster._kubernetes import INDEX_ENV, WORKER_HOSTS_ENV, worker_hosts_cluster
from keras_scaling.cluster._slurm import (
    PORT_ENV,
    NotInStepError,
    parse_tasks_per_node,
    slurm_cluster,
    step_port_base,
    task_gpus,
)
from keras_scaling.cluster._spec import ClusterSpec
from keras_scaling.launch._environment import LAUNCHED_ENV

__all__ = [
    "INDEX_ENV",
    "PORT_ENV",
    "WORKER_HOSTS_ENV",
    "ClusterSpec",
    "NotInStepError",
    "describe_cluster",
    "expand_hostlist",
    "parse_tasks_per_node",
    "resolve_cluster",
    "slurm_cluster",
    "step_port_base",
    "task_gpus",
    "tf_config_cluster",
    "worker_hosts_cluster",
]

NO_CLUSTER = "one process: no TF_CONFIG, Kubernetes worker list or Slurm step of several tasks"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _parse_tf_config(raw: str) -> dict:
    """`TF_CONFIG`'s JSON object; a `ValueError` says what is wrong with any other text."""
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object, got {raw!r}")
    return config


def tf_config_cluster(env: Mapping[str, str]) -> ClusterSpec | None:
    """The cluster `TF_CONFIG` describes, or None when it is unset or names one process.

    The chief is worker 0; the evaluator trains with nobody; `ps` tasks are refused.

    Args:
        env: mapping, the environment.

    Returns:
        A `ClusterSpec`, or None.

    Raises:
        ValueError: `TF_CONFIG` is not a JSON object, its task is not in its cluster, or it has `ps` tasks.

    Example:

    ```python
    import json
    from keras_scaling import cluster
    config = {"cluster": {"chief": ["c:2222"], "worker": ["w:2222"], "evaluator": ["e:2222"]},
              "task": {"type": "worker", "index": 0}}
    cluster.tf_config_cluster({"TF_CONFIG": json.dumps(config)}).num_workers   # 2
    ```
    """
    raw = env.get("TF_CONFIG")
    if not raw:
        return None
    config = _parse_tf_config(raw)
    jobs = config.get("cluster") or {}
    chief, workers, evaluator, servers = (
        tuple(jobs.get(job) or ()) for job in ("chief", "worker", "evaluator", "ps")
    )
    task = config.get("task") or {}
    task_type, task_index = task.get("type"), task.get("index", 0)
    if servers and task_type != "evaluator":
        named = "a parameter server" if len(servers) == 1 else f"{len(servers)} parameter servers"
        message = f"TF_CONFIG names {named} ('ps' tasks; this task is {task!r}): keras_scaling trains with all-reduce, and 'ps' tasks need tf.distribute.ParameterServerStrategy. Build that strategy yourself, or remove the 'ps' tasks (on Vertex AI, worker pool 2)."
        raise ValueError(message)
    # Kubeflow's TFJob and AI Platform leave the evaluator out of the cluster.
    outside = task_type == "evaluator" and not evaluator
    if len(chief) + len(workers) < 2 and not evaluator and not outside:
        return None
    known = {"chief": chief, "worker": workers, "evaluator": evaluator}
    if task_type not in known or not isinstance(task_index, int):
        message = f"TF_CONFIG's task must be {{'type': 'chief'|'worker'|'evaluator', 'index': N}}, got {task!r}"
        raise ValueError(message)
    if not outside and not 0 <= task_index < len(known[task_type]):
        message = f"TF_CONFIG's task is {task_type} {task_index}, but its cluster has {len(known[task_type])} {task_type} task(s)"
        raise ValueError(message)
    parts = [_count(len(tasks), job) for job, tasks in known.items() if tasks or job == "worker"]
    origin = f"TF_CONFIG: {', '.join(parts)}; this is {task_type} {task_index}"
    origin += ", outside the training cluster" if outside else ""
    source = "launch" if env.get(LAUNCHED_ENV) else "tf_config"
    origin += ", set by keras-scaling launch" if source == "launch" else ""
    return ClusterSpec(
        source, origin, workers, task_type, task_index, chief, evaluator, port_source="TF_CONFIG"
    )


def resolve_cluster(
    env: Mapping[str, str] | None = None, expand: Callable[[str, str], list[str]] = expand_hostlist
) -> ClusterSpec | None:
    """The multi-worker cluster this process is part of, or None for a single process.

    `TF_CONFIG` wins over `KERAS_SCALING_WORKER_HOSTS`, which wins over Slurm; `origin` names the losers.

    Args:
        env: mapping, the environment; default `os.environ`.
        expand: function expanding a Slurm host list.

    Returns:
        A `ClusterSpec`, or None.

    Raises:
        NotInStepError: inside a Slurm job of several tasks, outside `srun`.
        ValueError: the winning source's variables are malformed.

    Example:

    ```python
    from keras_scaling import cluster
    env = {"KERAS_SCALING_WORKER_HOSTS": "127.0.0.1:2222,127.0.0.1:2223",
           "JOB_COMPLETION_INDEX": "0"}
    cluster.resolve_cluster(env).origin
    # 'Kubernetes indexed job, pod 0 of 2 (KERAS_SCALING_WORKER_HOSTS)'
    cluster.resolve_cluster({})   # None: one process
    ```
    """
    env = os.environ if env is None else env
    candidates = [tf_config_cluster, worker_hosts_cluster, lambda env: slurm_cluster(env, expand)]
    for position, candidate in enumerate(candidates):
        spec = candidate(env)
        if spec is None:
            continue
        beaten = []
        for other in candidates[position + 1 :]:
            try:
                other_spec = other(env)
            except (ValueError, NotInStepError):
                continue
            if other_spec is not None:
                beaten.append(other_spec.origin)
        if beaten:
            origin = f"{spec.origin} (it wins over {'; '.join(beaten)})"
            spec = dataclasses.replace(spec, origin=origin)
        return spec
    return None


def describe_cluster(env: Mapping[str, str] | None = None) -> str:
    """One sentence saying where this process's cluster comes from.

    Args:
        env: mapping, the environment; default `os.environ`.

    Returns:
        str, such as `"Slurm job 1234 step 0: 4 tasks on 2 nodes"`, or `"one process: ..."`.

    Raises:
        NotInStepError, ValueError: as `resolve_cluster`.

    Example:

    ```python
    from keras_scaling import cluster
    print(cluster.describe_cluster())
    ```
    """
    spec = resolve_cluster(env)
    return NO_CLUSTER if spec is None else spec.origin
