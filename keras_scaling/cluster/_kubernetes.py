"""A Kubernetes Indexed Job's pods as a cluster, from `JOB_COMPLETION_INDEX` and a host list."""

from collections.abc import Mapping

from keras_scaling.cluster._hostlist import expand_hostlist_python
from keras_scaling.cluster._spec import ClusterSpec

WORKER_HOSTS_ENV = "KERAS_SCALING_WORKER_HOSTS"
INDEX_ENV = "JOB_COMPLETION_INDEX"


def _check_address(address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        message = f"{WORKER_HOSTS_ENV}: {address!r} is not host:port; write each worker as host:port, such as 'train-[0-3].train-svc:2222'"
        raise ValueError(message)
    if ":" in host and not host.startswith("["):
        message = f"{WORKER_HOSTS_ENV}: {address!r} has an IPv6 address without brackets; write it as [address]:port, such as '[fd00::1]:2222'"
        raise ValueError(message)


def worker_hosts_cluster(env: Mapping[str, str]) -> ClusterSpec | None:
    """The cluster named by `KERAS_SCALING_WORKER_HOSTS` and `JOB_COMPLETION_INDEX`, or None.

    None when `KERAS_SCALING_WORKER_HOSTS` is unset; the pod of index `i` is worker `i`.

    Args:
        env: mapping, the environment.

    Returns:
        A `ClusterSpec`, or None.

    Raises:
        ValueError: the host list is malformed, or the index missing or outside it.

    Example:

    ```python
    from keras_scaling import cluster
    env = {"KERAS_SCALING_WORKER_HOSTS": "train-[0-3].train-svc:2222",
           "JOB_COMPLETION_INDEX": "2"}
    spec = cluster.worker_hosts_cluster(env)
    spec.workers[2], spec.task_index   # ('train-2.train-svc:2222', 2)
    ```
    """
    text = env.get(WORKER_HOSTS_ENV)
    if text is None or not text.strip():
        return None
    workers = tuple(expand_hostlist_python(text, WORKER_HOSTS_ENV))
    for address in workers:
        _check_address(address)
    if len(set(workers)) != len(workers):
        raise ValueError(f"{WORKER_HOSTS_ENV}={text!r} names a worker twice")
    index_text = env.get(INDEX_ENV)
    if index_text is None or not index_text.strip().isdigit():
        message = f"{WORKER_HOSTS_ENV} is set but {INDEX_ENV} is {index_text!r}: each pod needs its index, which an Indexed Job (completionMode: Indexed) or a JobSet sets; outside Kubernetes, set {INDEX_ENV} to this worker's index"
        raise ValueError(message)
    index = int(index_text)
    if index >= len(workers):
        message = f"{INDEX_ENV}={index}, but {WORKER_HOSTS_ENV}={text!r} names {len(workers)} workers (indices 0 to {len(workers) - 1}): make the Job's completions and parallelism equal to the number of workers"
        raise ValueError(message)
    # A JobSet names itself; a plain Indexed Job's name is not in its pods' env.
    job = env.get("JOBSET_NAME")
    name = f"Kubernetes JobSet {job!r}" if job else "Kubernetes indexed job"
    origin = f"{name}, pod {index} of {len(workers)} ({WORKER_HOSTS_ENV})"
    return ClusterSpec("kubernetes", origin, workers, "worker", index, port_source=WORKER_HOSTS_ENV)
