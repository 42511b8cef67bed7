"""A Slurm job step's tasks as a cluster: plain functions of the environment."""

import re
from collections.abc import Callable, Mapping

from keras_scaling.cluster._hostlist import expand_hostlist
from keras_scaling.cluster._spec import ClusterSpec

PORT_ENV = "KERAS_SCALING_PORT"
# Below Linux's ephemeral range (32768-60999), where outgoing connections' ports are.
PORT_RANGE = (20000, 32768)
STEPS_PER_JOB = 8  # steps 0 to 7 get ports of their own; step 8 shares step 0's
_TASKS_PER_NODE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_tasks_per_node(text: str, parameter: str = "SLURM_STEP_TASKS_PER_NODE") -> list[int]:
    """Expands Slurm's tasks-per-node notation: `"2(x3),1"` is `[2, 2, 2, 1]`.

    Args:
        text: str, such as `SLURM_STEP_TASKS_PER_NODE`.
        parameter: str, its name in error messages.

    Returns:
        list of int, the tasks on each node in node-list order.

    Raises:
        ValueError: the text is not in that notation.

    Example:

    ```python
    from keras_scaling import cluster
    cluster.parse_tasks_per_node("2(x3),1")   # [2, 2, 2, 1]
    ```
    """
    counts = []
    for part in str(text).strip().split(","):
        match = _TASKS_PER_NODE.match(part.strip())
        if match is None:
            message = f"{parameter} must look like '2(x3),1' (2 tasks on each of 3 nodes, then 1), got {text!r}"
            raise ValueError(message)
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    try:
        return int(value) if value else None
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _job_tasks(env: Mapping[str, str]) -> int:
    """The tasks `srun` would start in this job: `--ntasks`, else `SLURM_TASKS_PER_NODE`'s."""
    ntasks = _int(env, "SLURM_NTASKS") or _int(env, "SLURM_NPROCS")
    if ntasks:
        return ntasks
    try:
        return sum(parse_tasks_per_node(env.get("SLURM_TASKS_PER_NODE") or "1"))
    except ValueError:
        return _int(env, "SLURM_JOB_NUM_NODES") or _int(env, "SLURM_NNODES") or 1


def in_slurm_job(env: Mapping[str, str]) -> bool:
    """Whether the environment is a Slurm job's (a batch script, `salloc` shell or step)."""
    return bool(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))


def in_slurm_step(env: Mapping[str, str]) -> bool:
    """Whether this process is a task of a Slurm job step (started by `srun`)."""
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    # The batch script is step "batch" (unset in Slurm 22.05), an salloc shell "extern"/unset.
    return in_slurm_job(env) and step is not None and step.isdigit()


def step_port_base(job_id: int, step_id: int, tasks_on_busiest_node: int = 1) -> int:
    """The first port of a step's tasks on each node, the same on every task (scheme: docs/guides/clusters.md).

    Args:
        job_id: int, `SLURM_JOB_ID`.
        step_id: int, `SLURM_STEP_ID`.
        tasks_on_busiest_node: int, the most tasks on one node of the step.

    Returns:
        int, the port of local rank 0; local rank r uses port + r.

    Example:

    ```python
    from keras_scaling import cluster
    cluster.step_port_base(1234, 0)   # 29872: the same on every task of the step
    cluster.step_port_base(1234, 1)   # 29873
    ```
    """
    block = max(1, tasks_on_busiest_node)
    jobs_in_range = (PORT_RANGE[1] - PORT_RANGE[0]) // (STEPS_PER_JOB * block)
    if jobs_in_range < 1:
        message = f"tasks_on_busiest_node={tasks_on_busiest_node} leaves no room for {STEPS_PER_JOB} steps in ports {PORT_RANGE[0]}-{PORT_RANGE[1] - 1}: set {PORT_ENV} to the first of a free range of that many ports"
        raise ValueError(message)
    slot = (job_id % jobs_in_range) * STEPS_PER_JOB + step_id % STEPS_PER_JOB
    return PORT_RANGE[0] + slot * block


class NotInStepError(RuntimeError):
    """A Slurm job of several tasks runs this Python as one process, outside `srun`: it would train alone.

    Args:
        *args: the message, as for any exception.

    Example:

    ```python
    from keras_scaling import cluster
    try:
        cluster.slurm_cluster({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"})
    except cluster.NotInStepError as error:
        print(error)   # ... Start one process per task with srun: ...
    ```
    """


def slurm_cluster(
    env: Mapping[str, str], expand: Callable[[str, str], list[str]] = expand_hostlist
) -> ClusterSpec | None:
    """The cluster of the Slurm job step this process is a task of, or None.

    None outside Slurm and in a step of one task; worker 0 is local rank 0 on the first node.

    Args:
        env: mapping, the environment.
        expand: function expanding a compressed host list.

    Returns:
        A `ClusterSpec`, or None.

    Raises:
        NotInStepError: a job of several tasks runs this process outside `srun`.
        ValueError: the step's variables are malformed or disagree, or `KERAS_SCALING_PORT`'s.

    Example:

    ```python
    from keras_scaling import cluster
    env = {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4",
           "SLURM_STEP_NODELIST": "gpu[01-02]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
           "SLURMD_NODENAME": "gpu02", "SLURM_LOCALID": "1", "SLURM_PROCID": "3"}
    cluster.slurm_cluster(env).task_index   # 3: local rank 1 on the second node
    ```
    """
    if not in_slurm_job(env):
        return None
    job_id = _int(env, "SLURM_JOB_ID") or _int(env, "SLURM_JOBID")
    if not in_slurm_step(env):
        ntasks = _job_tasks(env)
        if ntasks > 1:
            message = f"Slurm job {job_id} has {ntasks} tasks, but this Python runs outside a job step, so it would train alone while the other {ntasks - 1} never start. Start one process per task with srun: `srun python train.py` (or `srun --ntasks=1 python train.py` for one process)."
            raise NotInStepError(message)
        return None
    step_id = _int(env, "SLURM_STEP_ID" if "SLURM_STEP_ID" in env else "SLURM_STEPID")
    num_tasks = _int(env, "SLURM_STEP_NUM_TASKS") or _int(env, "SLURM_NTASKS") or 1
    if num_tasks < 2:
        return None
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    hosts = expand(nodelist, "SLURM_STEP_NODELIST")
    tasks_text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
    tasks_per_node = parse_tasks_per_node(tasks_text)
    if len(tasks_per_node) != len(hosts) or sum(tasks_per_node) != num_tasks:
        message = f"Slurm step {job_id}.{step_id}: SLURM_STEP_TASKS_PER_NODE={tasks_text!r} ({sum(tasks_per_node)} tasks on {len(tasks_per_node)} nodes) does not match SLURM_STEP_NODELIST={nodelist!r} ({len(hosts)} nodes) and SLURM_STEP_NUM_TASKS={num_tasks}"
        raise ValueError(message)
    node_name = env.get("SLURMD_NODENAME")
    node_index = hosts.index(node_name) if node_name in hosts else _int(env, "SLURM_NODEID") or 0
    local_rank = _int(env, "SLURM_LOCALID") or 0
    if not 0 <= node_index < len(hosts) or not 0 <= local_rank < tasks_per_node[node_index]:
        message = f"Slurm step {job_id}.{step_id}: node {node_index} (SLURMD_NODENAME={node_name!r}) local rank {local_rank} is not a task of SLURM_STEP_NODELIST={nodelist!r} with SLURM_STEP_TASKS_PER_NODE={tasks_text!r}"
        raise ValueError(message)
    busiest = max(tasks_per_node)
    assert job_id is not None and step_id is not None  # in_slurm_step read both
    override = _int(env, PORT_ENV)
    if override is not None and not 1024 <= override <= 65535 - busiest:
        message = f"{PORT_ENV} must be a port from 1024 to {65535 - busiest} (the task of local rank r on a node uses {PORT_ENV} + r), got {override}"
        raise ValueError(message)
    port_base = override if override is not None else step_port_base(job_id, step_id, busiest)
    ranks = [(host, rank) for host, count in zip(hosts, tasks_per_node) for rank in range(count)]
    workers = tuple(f"{host}:{port_base + rank}" for host, rank in ranks)
    nodes = "node" if len(hosts) == 1 else "nodes"
    return ClusterSpec(
        source="slurm",
        origin=f"Slurm job {job_id} step {step_id}: {num_tasks} tasks on {len(hosts)} {nodes}",
        workers=workers,
        task_type="worker",
        task_index=sum(tasks_per_node[:node_index]) + local_rank,
        local_rank=local_rank,
        tasks_on_node=tasks_per_node[node_index],
        port_source=PORT_ENV if override is not None else f"job {job_id} step {step_id}",
    )


def _device_ids(text: object) -> list[str]:
    ids = [part.strip() for part in str(text).split(",") if part.strip()]
    # Slurm writes "N/A" or an empty list when it bound nothing.
    return [value for value in ids if value.upper() not in ("N/A", "NONE", "NOGPU")]


def _bound_per_task(env: Mapping[str, str]) -> bool:
    """Whether `sbatch` options asked for GPUs per task (`srun`'s alone leave no variable)."""
    if env.get("SLURM_GPUS_PER_TASK"):
        return True
    bind = [part.strip() for part in env.get("SLURM_GPU_BIND", "").split(",")]
    kinds = {part.split(":")[0] for part in bind if part and part != "verbose"}
    return bool(kinds - {"none"})


def _step_gpu_count(env: Mapping[str, str]) -> int | None:
    if env.get("SLURM_STEP_GPUS"):
        return len(_device_ids(env["SLURM_STEP_GPUS"]))
    count = _int(env, "SLURM_GPUS_ON_NODE")
    if count is None and env.get("SLURM_JOB_GPUS"):
        return len(_device_ids(env["SLURM_JOB_GPUS"]))
    return count


def task_gpus(env: Mapping[str, str], local_rank: int, tasks_on_node: int) -> list[str] | None:
    """The GPU ids this task should see, or None to leave them be (GPUs bound per task, no GPUs).

    When every task of a node sees all the step's GPUs of the node, each takes an equal share.

    Args:
        env: mapping, the environment.
        local_rank: int, the task's rank on its node.
        tasks_on_node: int, the step's tasks on this node.

    Returns:
        list of str (the ids for `CUDA_VISIBLE_DEVICES`), or None.

    Raises:
        ValueError: the GPUs the tasks of a node share do not divide among them.

    Example:

    ```python
    from keras_scaling import cluster
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "0,1,2,3"}
    cluster.task_gpus(env, local_rank=1, tasks_on_node=2)   # ['2', '3']
    ```
    """
    if tasks_on_node < 2 or _bound_per_task(env):
        return None
    step_gpus = _step_gpu_count(env)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = _device_ids(visible)
        if step_gpus is not None and len(gpus) < step_gpus:
            # Fewer than the step's: Slurm bound these to this task.
            return None
    elif env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"):
        gpus = _device_ids(env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"))
    else:
        gpus = [str(index) for index in range(step_gpus or 0)]
    if not gpus:
        return None
    if len(gpus) % tasks_on_node:
        message = f"the {tasks_on_node} tasks on this node all see the same {len(gpus)} GPUs ({','.join(gpus)}), which do not divide among them. Ask Slurm for GPUs per task (`srun --gpus-per-task=1`), or as many tasks per node as GPUs (`--ntasks-per-node={len(gpus)}`)."
        raise ValueError(message)
    share = len(gpus) // tasks_on_node
    return gpus[local_rank * share : (local_rank + 1) * share]
