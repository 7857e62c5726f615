"""A second node 0 in front of a running cluster's other nodes, with settings of its own: a test that needs
the gateway configured otherwise (a reply cache, a short deadline) starts one node instead of
restarting the cluster's node 0 twice, and the cluster's other tests keep their gateway as it was."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tools.local import LocalCluster, free_ports


@contextmanager
def second_gateway(cluster: LocalCluster, log_dir: Path, timeout_s: float = 240, **env: str) -> Iterator[LocalCluster]:
    """Node 0 (gateway and worker) on a free port, `env` over `cluster`'s settings, routing to its own
    worker and `cluster`'s others, searching `cluster`'s index nodes; healthy with every worker in its
    rotation. Stopped (SIGTERM, drained) on leaving."""
    port, = free_ports(1)
    gateway = LocalCluster({**cluster.env, "NODE_0_IP": f"127.0.0.1:{port}", **env}, log_dir, cluster.python,
                           cluster.launcher)
    try:
        gateway.start_node(0)
        gateway.wait_healthy(nodes=(0,), timeout_s=timeout_s)
        gateway.wait_rotation(timeout_s=timeout_s)
        yield gateway
    finally:
        gateway.stop()
