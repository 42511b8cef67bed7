"""A throw-away Slurm cluster for the tests of this directory (`make test-cluster`).

`slurm` is one single-node cluster on 127.0.0.1 for the whole session
(`slurm_cluster.SlurmCluster`: its own MUNGE key, configuration and state
under a temporary directory, daemons stopped by PID whatever happens). It
needs Debian's Slurm and MUNGE, which `.ci/install-slurm` installs, and
root; without them the tests that use it fail, naming the fix.
"""

import os
import socket
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from slurm_cluster import SlurmCluster, missing_commands  # noqa: E402


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    missing = missing_commands()
    if missing:
        pytest.fail(f"Slurm is not installed ({', '.join(missing)} missing): run .ci/install-slurm")
    if os.geteuid() != 0:
        pytest.fail("the throw-away Slurm cluster runs its daemons and jobs as root: run as root")
    node = socket.gethostname().split(".")[0]
    addresses = {info[4][0] for info in socket.getaddrinfo(node, None, socket.AF_INET)}
    if not all(address.startswith("127.") for address in addresses):
        pytest.fail(
            f"this host's name {node!r} resolves to {sorted(addresses)}, not loopback: "
            "the test cluster's node must be reached on 127.0.0.1 only (add it to /etc/hosts)"
        )
    # A short path: MUNGE's socket path must fit in 108 bytes.
    with SlurmCluster(str(tmp_path_factory.mktemp("slurm"))) as cluster:
        print(f"slurm: node {cluster.node_name} idle {cluster.startup_s:.1f} s after start")
        yield cluster
