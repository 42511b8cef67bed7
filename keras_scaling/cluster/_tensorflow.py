"""What `auto_strategy()` does with a `ClusterSpec` that no `TF_CONFIG` describes."""

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
                message = f"{spec.origin}: the node name {host!r} of SLURM_STEP_NODELIST does not resolve to an address here ({error}); make Slurm's node names resolvable, or set TF_CONFIG in the job script (it wins over Slurm's)."
                raise ValueError(message) from None
    port = int(spec.address.rpartition(":")[2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As gRPC binds: a requeued job's connections in TIME_WAIT do not hold the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as error:
            fix = f"Change the port in {WORKER_HOSTS_ENV}"
            if spec.source == "slurm":
                fix = f"Set {PORT_ENV} to a free port in the job script, the same for every task"
            message = f"{spec.origin}: this task's port {port} ({spec.task_type} {spec.task_index}, ports from {spec.port_source}) is in use on this node ({error.strerror}). {fix}."
            raise ValueError(message) from None


def bind_task_gpus(spec: "ClusterSpec") -> None:
    """Gives this task its share of the node's GPUs when Slurm bound them all to every task."""
    gpus = task_gpus(os.environ, spec.local_rank, spec.tasks_on_node)
    if gpus is None:
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = visible = ",".join(gpus)
    message = "auto_strategy: local rank %d of %d on this node takes GPUs %s"
    logger.info(message, spec.local_rank, spec.tasks_on_node, visible)


def cluster_resolver(spec: "ClusterSpec") -> tf.distribute.cluster_resolver.ClusterResolver:
    """The TensorFlow resolver of a cluster that no TF_CONFIG describes."""
    # The physical list: reading it leaves TensorFlow's context, which collectives need, unset.
    gpus = len(tf.config.list_physical_devices("GPU"))
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec.cluster_dict()),
        task_type=spec.task_type,
        task_id=spec.task_index,
        num_accelerators={"GPU": gpus} if gpus else None,
        rpc_layer="grpc",
    )
