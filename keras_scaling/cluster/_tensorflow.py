"""What a process does with its `ClusterSpec`: checks, GPUs, and TensorFlow's resolver.

`keras_scaling.devices.auto_strategy()` calls these before it builds a
`MultiWorkerMirroredStrategy` over a cluster that no `TF_CONFIG` describes.
"""

import logging
import os
import socket
from typing import TYPE_CHECKING

import tensorflow as tf

from keras_scaling.cluster._kubernetes import WORKER_HOSTS_ENV
from keras_scaling.cluster._slurm import PORT_ENV, task_gpus

if TYPE_CHECKING:
    from keras_scaling.cluster import ClusterSpec

logger = logging.getLogger("keras_scaling")


def check_addresses(spec: "ClusterSpec") -> None:
    """Fails, naming the fix, when a Slurm node does not resolve or this task's port is taken."""
    if spec.source == "slurm":
        for address in (*spec.chief, *spec.workers):
            host = address.rpartition(":")[0]
            try:
                socket.getaddrinfo(host, None)
            except OSError as error:
                raise ValueError(
                    f"{spec.origin}: the node name {host!r} of SLURM_STEP_NODELIST does "
                    f"not resolve to an address here ({error}), so the workers cannot "
                    "reach each other. Ask the cluster's administrators to make Slurm's "
                    "node names resolvable host names, or set TF_CONFIG in the job "
                    "script (it wins over Slurm's variables)."
                ) from None
    port = int(spec.address.rpartition(":")[2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As gRPC binds: the connections of a run that just ended (a requeued
        # job's, in TIME_WAIT) do not hold the port; a listening socket does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            # TensorFlow's server listens on every interface.
            sock.bind(("", port))
        except OSError as error:
            if spec.source == "slurm":
                fix = (
                    f"Set {PORT_ENV} to a free port in the job script, the same "
                    f"for every task (local rank r uses {PORT_ENV} + r)"
                )
            else:
                fix = f"Change the port in {WORKER_HOSTS_ENV}"
            raise ValueError(
                f"{spec.origin}: this task's port {port} ({spec.task_type} "
                f"{spec.task_index}, ports from {spec.port_source}) is in use on this "
                f"node ({error.strerror}): another job's worker or another program "
                f"holds it. {fix}."
            ) from None


def bind_task_gpus(spec: "ClusterSpec") -> None:
    """Gives this task its share of the node's GPUs when Slurm bound them all to every task."""
    gpus = task_gpus(os.environ, spec.local_rank, spec.tasks_on_node)
    if gpus is None:
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    logger.info(
        "auto_strategy: local rank %d of %d on this node takes GPUs %s of the node's",
        spec.local_rank,
        spec.tasks_on_node,
        ",".join(gpus),
    )


def cluster_resolver(spec: "ClusterSpec") -> tf.distribute.cluster_resolver.ClusterResolver:
    """The TensorFlow resolver of a cluster that no TF_CONFIG describes."""
    # A SimpleClusterResolver reports the accelerators it is given; the
    # physical list (what Slurm or CUDA_VISIBLE_DEVICES left visible) is read
    # without initialising TensorFlow's context, which collective ops need.
    gpus = len(tf.config.list_physical_devices("GPU"))
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec.cluster_dict()),
        task_type=spec.task_type,
        task_id=spec.task_index,
        num_accelerators={"GPU": gpus} if gpus else None,
        rpc_layer="grpc",
    )
