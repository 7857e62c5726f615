"""One index node (node 2's role, `python -m services.node`) serving one data version's index on a free port of
127.0.0.1, for tools that search through the served path without a whole cluster."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from profiling.lib.local_cluster import ROOT, free_ports, stop

STARTUP_TIMEOUT_S = 180.0


@contextlib.contextmanager
def serving(index_path: str | Path, log_path: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """The node's base URL while it runs (ready: /ready answered 200); stopped (SIGTERM) on leaving."""
    with serving_process(index_path, log_path, env) as (url, _):
        yield url


@contextlib.contextmanager
def serving_process(index_path: str | Path, log_path: Path,
                    env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """serving's URL and the node's process (for its memory), while it runs."""
    ports = free_ports(3)
    node_env = {**(env if env is not None else os.environ), "TOTAL_NODES": "3", "NODE_NUMBER": "2",
                "INDEX_NODES": "2", "INDEX_SHARDS": "1", "FAISS_INDEX_PATH": str(index_path),
                **{f"NODE_{n}_IP": f"127.0.0.1:{port}" for n, port in enumerate(ports)}}
    url = f"http://127.0.0.1:{ports[2]}"
    with open(log_path, "ab") as log:
        node = subprocess.Popen([sys.executable, "-m", "services.node"], cwd=ROOT, env=node_env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(url, node, log_path)
        yield url, node
    finally:
        stop(node)


def node_memory(pid: int) -> dict[str, int]:
    """A process's resident bytes: all, anonymous (its heap) and file-backed (for a node, the mapped index it
    touched)."""
    fields = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name = line.split(":", 1)[0]
            if name in fields:
                found[fields[name]] = int(line.split()[1]) * 1024
    return found


def served_nprobe(url: str) -> int | None:
    """The nprobe the node serves with, as its /health reports it (NPROBE where set, else the manifest's)."""
    return requests.get(f"{url}/health", timeout=10).json().get("nprobe")


def wait_ready(url: str, node: subprocess.Popen, log_path: Path, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        if node.poll() is not None:
            raise RuntimeError(f"the index node exited ({node.returncode}) before it was ready; its log: {log_path}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"the index node at {url} was not ready within {timeout_s:.0f}s; its log: {log_path}")


def search_latencies_ms(search, queries, batch: int, repeat: int, deadline: float | None = None) -> list[float]:
    """ms of each of `repeat` calls `search(batch of queries)`, the batches taken in turn through `queries`;
    past `deadline` (time.monotonic()) it stops once two calls are timed."""
    times: list[float] = []
    for i in range(repeat):
        if deadline is not None and time.monotonic() > deadline and len(times) >= 2:
            break
        start = (i * batch) % max(1, len(queries) - batch)
        started = time.perf_counter()
        search(queries[start : start + batch])
        times.append((time.perf_counter() - started) * 1000)
    return times
