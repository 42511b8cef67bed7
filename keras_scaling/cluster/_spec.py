"""`ClusterSpec`: one process's view of a multi-worker cluster, with no TensorFlow."""

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """A multi-worker cluster, this process's task in it, and where it came from.

    Args:
        source: str, `"slurm"`, `"kubernetes"`, `"tf_config"` or `"launch"`.
        origin: str, where the cluster came from, such as `"Slurm job 1234 step 0: 4 tasks on 2 nodes"`.
        workers: tuple of `"host:port"`, the `worker` tasks in index order.
        task_type: str, this process's task: `"worker"`, `"chief"` or `"evaluator"`.
        task_index: int, this process's index among the tasks of its type.
        chief: tuple of `"host:port"`, the `chief` task (worker 0 of the training), if any.
        evaluator: tuple of `"host:port"`, the `evaluator` task, if any.
        local_rank: int, this task's rank among the tasks on its node.
        tasks_on_node: int, the tasks of the cluster on this node.
        port_source: str, where the ports came from (for messages).

    Example:

    ```python
    from keras_scaling import cluster
    spec = cluster.ClusterSpec(
        source="tf_config", origin="TF_CONFIG",
        workers=("127.0.0.1:2222", "127.0.0.1:2223"), task_type="worker", task_index=1)
    spec.num_workers      # 2
    spec.tf_config()["task"]   # {'type': 'worker', 'index': 1}
    ```
    """

    source: str
    origin: str
    workers: tuple[str, ...]
    task_type: str
    task_index: int
    chief: tuple[str, ...] = ()
    evaluator: tuple[str, ...] = ()
    local_rank: int = 0
    tasks_on_node: int = 1
    port_source: str = ""

    @property
    def num_workers(self) -> int:
        """The processes that train together: the chief and the workers."""
        return len(self.chief) + len(self.workers)

    @property
    def address(self) -> str:
        """This task's `"host:port"`, or `""` for an evaluator its cluster leaves out."""
        tasks = self.cluster_dict().get(self.task_type, [])
        return tasks[self.task_index] if self.task_index < len(tasks) else ""

    def cluster_dict(self) -> dict[str, list[str]]:
        """`{"chief": [...], "worker": [...], "evaluator": [...]}`, empty jobs left out."""
        jobs = {"chief": self.chief, "worker": self.workers, "evaluator": self.evaluator}
        return {name: list(tasks) for name, tasks in jobs.items() if tasks}

    def tf_config(self) -> dict[str, Any]:
        """The `TF_CONFIG` dict that describes this cluster and task."""
        task = {"type": self.task_type, "index": self.task_index}
        return {"cluster": self.cluster_dict(), "task": task}
