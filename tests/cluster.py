"""Starting a real three-node cluster on 127.0.0.1 for tests (free ports, tiny stand-ins)."""
from __future__ import annotations

import os
from pathlib import Path

from services.local_cluster import LocalCluster, free_ports
from tests.conftest import TEST_ENV, data_env


def cluster_env(data, **extra: str) -> dict[str, str]:
    ports = free_ports(3)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NODE_", "FAISS_", "DOCUMENTS_"))}
    env.update(TEST_ENV)
    env.update(data_env(data))
    env.update({f"NODE_{i}_IP": f"127.0.0.1:{port}" for i, port in enumerate(ports)})
    env.update({"TORCH_THREADS": "1", "FAISS_THREADS": "1", "HEALTH_INTERVAL_S": "0.5", "LOG_LEVEL": "info"})
    env.update(extra)
    return env


def start_cluster(data, log_dir: Path, **extra: str) -> LocalCluster:
    cluster = LocalCluster(cluster_env(data, **extra), log_dir)
    try:
        cluster.start(timeout_s=240)
    except Exception:
        cluster.stop()
        raise
    return cluster
