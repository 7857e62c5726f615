"""Helpers the tests share (imported, unlike fixtures): the test environment and a real local cluster."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import requests

from tools.local import LocalCluster, free_ports

# What every test runs with: tiny stand-ins, float32 on the CPU (the oracle's precision).
TEST_ENV = {"MODEL_SOURCE": "standin", "STANDIN_PROFILE": "tiny", "PRECISION": "float32", "ONLY_CPU": "true"}


def data_env(result) -> dict[str, str]:
    """The environment that points a node at a built data set (index file and documents folder)."""
    return {"FAISS_INDEX_PATH": str(result.index_path), "DOCUMENTS_DIR": str(result.db_path.parent)}


def cluster_env(data, **extra: str) -> dict[str, str]:
    """The environment of a cluster on 127.0.0.1 with free ports: three nodes, or as many as the
    TOTAL_NODES in `extra` (tools.local.local_topology lays out more)."""
    ports = free_ports(int(extra.get("TOTAL_NODES", 3)))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NODE_", "FAISS_", "DOCUMENTS_", "INDEX_", "TOTAL_NODES", "WORKER_NODES"))}
    env.update(TEST_ENV)
    env.update(data_env(data))
    env.update({f"NODE_{i}_IP": f"127.0.0.1:{port}" for i, port in enumerate(ports)})
    env.update({"TORCH_THREADS": "1", "FAISS_THREADS": "1", "HEALTH_INTERVAL_S": "0.5", "LOG_LEVEL": "info"})
    env.update(extra)
    return env


def start_cluster(data, log_dir: Path, *, commands: Mapping[int, Sequence[str]] | None = None,
                  **extra: str) -> LocalCluster:
    """Real node processes on 127.0.0.1 (free ports), healthy; the caller stops them. Three nodes, or
    the topology `extra` sets (TOTAL_NODES, INDEX_NODES, INDEX_SHARDS: local_topology).

    `commands`: a node's own command line (tests.support's wrapped nodes), by node number."""
    cluster = LocalCluster(cluster_env(data, **extra), log_dir)
    try:
        if commands:
            for node in cluster.start_order:  # the index first, workers search it at once
                cluster.start_node(node, command=commands.get(node))
            cluster.wait_healthy(timeout_s=240)
            cluster.wait_rotation(timeout_s=240)
        else:
            cluster.start(timeout_s=240)
    except Exception:
        cluster.stop()
        raise
    return cluster


def post_query(target: LocalCluster | str, request_id: str, query: str = "Where is my order?",
               timeout: float = 180) -> requests.Response:
    """POST /query to node 0: `target` is a running cluster or node 0's base URL."""
    url = target if isinstance(target, str) else target.url(0)
    return requests.post(f"{url}/query", json={"request_id": request_id, "query": query}, timeout=timeout)


def health(cluster: LocalCluster, node: int) -> dict:
    """A node's /health body, whatever its status."""
    return requests.get(f"{cluster.url(node)}/health", timeout=10).json()


def uid(prefix: str) -> str:
    """A request id no earlier request of the run used."""
    return f"{prefix}-{time.time_ns()}"


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
    """Poll `condition` until it holds; fail with `what` past timeout_s (a bound, not a pace)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(poll_s)


def leftovers(out_dir: Path) -> list[Path]:
    """Every file under a folder: what a failed or refused build left behind."""
    return [p for p in out_dir.rglob("*") if p.is_file()]


class ManualClock:
    """A clock a test moves by hand (`clock.now += 1`): time-dependent code without sleeps."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def run_joining(engine, requests: Sequence, join_every: int = 1) -> list:
    """Step a ContinuousEngine until it is idle, request i joining `join_every` steps after request
    i - 1; each request's sequence, in the requests' order. Fails on any failed sequence."""
    seqs, pending, step = {}, list(enumerate(requests)), 0
    while pending or engine.has_work():
        if pending and step % join_every == 0:
            i, request = pending.pop(0)
            seqs[i] = engine.add(request)
        assert not engine.step().failed
        step += 1
    return [seqs[i] for i in range(len(requests))]

