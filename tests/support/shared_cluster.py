"""The clusters the integration tests share (fixtures in tests/integration/conftest.py): each one is
started when the first test that asks for it runs, serves every such test of the session, and is
stopped at the session's end. After each test that used it, `settle` waits until it is as tests
find it (every node healthy, both workers in the gateway's rotation, nothing in flight), and says
what the test had left otherwise (a stopped node, changed settings), having put that right so the
next test does not fail for it.

Two clusters, because their settings conflict:

- `PLAIN` (the support data set, as the `reference` fixture reads it): what most modules need,
  unified: a rerank wait long enough that a burst shares batches, JSON logs and a span file per
  node (read by test_observability and test_tracing), a health interval long enough that a worker
  marked down stays down while a test looks and a short HTTP read timeout (test_hostile_input).
- `KEYED_CACHE`: node 0 with a reply cache, API keys, CORS and a small body limit, node 2 an index
  whose searches a test can hold (`cluster.slow_index`, tests.support.SlowIndex; not held, it is
  a usual index). A reply cache answers repeated questions without a worker, which the served counts, round
  robin and stage metrics of the PLAIN tests cannot allow; and the load generator and the latency
  breakdown tool send no API key, so keys cannot be on PLAIN.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from profiling.lib.prometheus import scrape
from tests.helpers import cluster_env, wait_until
from tests.support import SlowIndex, forked_nodes
from tools.local import LocalCluster

# How long a cluster may take to get back to idle and whole after a test (a node restarting loads its models).
SETTLE_TIMEOUT_S = 240
START_TIMEOUT_S = 240

# KEYED_CACHE's API keys: two clients, whose request ids are each their own.
KEY = "test-key-0123456789"
OTHER_KEY = "other-key-9876543210"
ORIGIN = "http://127.0.0.1:5173"


@dataclass(frozen=True)
class ClusterSettings:
    """A shared cluster's settings beyond tests.helpers.cluster_env's: its API keys, and whether node 2
    is an index whose delay a test sets (tests.support.SlowIndex)."""
    env: Mapping[str, str]
    api_keys: Sequence[str] = ()
    slow_index: bool = False


PLAIN = ClusterSettings({"RERANK_MAX_WAIT_MS": "20", "LOG_FORMAT": "json", "TRACING": "jsonl",
                         "HEALTH_INTERVAL_S": "5", "HTTP_READ_TIMEOUT_S": "3"})
KEYED_CACHE = ClusterSettings({"RESPONSE_CACHE_SIZE": "64", "CORS_ALLOWED_ORIGINS": ORIGIN, "MAX_BODY_BYTES": "4096"},
                              api_keys=(KEY, OTHER_KEY), slow_index=True)


class SharedCluster(LocalCluster):
    """A LocalCluster tests use in turn, its nodes forked (tests/support/forked_nodes.py) as
    tests.helpers.start_cluster's are: each node appends its spans to a file of its own (also when a
    test restarts it), a node restarted without a command gets its own back, and `settle` after each test."""

    def __init__(self, env: Mapping[str, str], log_dir: Path, slow_index: SlowIndex | None):
        super().__init__(env, log_dir, launcher=forked_nodes.launch)
        self.slow_index = slow_index
        self.commands: dict[int, Sequence[str]] = {2: slow_index.command()} if slow_index else {}
        self._settings_env = dict(self.env)

    def trace_path(self, node: int) -> Path:
        return self.log_dir / f"traces-node{node}.jsonl"

    def start_node(self, node: int, *, command: Sequence[str] | None = None):
        self.env["TRACING_FILE"] = str(self.trace_path(node))
        try:
            return super().start_node(node, command=self.commands.get(node) if command is None else command)
        finally:
            del self.env["TRACING_FILE"]

    def idle(self) -> bool:
        """Nothing in flight at the gateway, nothing running or waiting in either worker's generate stage."""
        gateway = requests.get(f"{self.url(0)}/health", timeout=10).json()["gateway"]
        if gateway["in_flight"] or gateway["joining"]:
            return False
        for node in self.settings.cluster.workers:
            snapshot = scrape(f"{self.url(node)}/metrics")
            if snapshot.error or any(snapshot.get(name, stage="generate") for name in (
                    "rag_generate_running_sequences", "rag_generate_waiting_sequences")):
                return False
        return True

    def settle(self, timeout_s: float = SETTLE_TIMEOUT_S) -> list[str]:
        """Wait until the cluster is as tests find it; what the last test had left otherwise (put right)."""
        left = []
        if self.env != self._settings_env:
            left.append(f"settings changed: {sorted(set(self.env.items()) ^ set(self._settings_env.items()))}")
            self.env = dict(self._settings_env)
        stopped = [node for node in self.start_order if node not in self.procs or self.procs[node].poll() is not None]
        for node in stopped:
            self.start_node(node)
        if stopped:
            left.append(f"nodes {stopped} stopped (restarted)")
        self.wait_healthy(timeout_s=timeout_s)
        self.wait_rotation(timeout_s=timeout_s)
        wait_until(self.idle, timeout_s, f"the cluster still busy {timeout_s}s after the test", poll_s=0.2)
        return left


def start_shared_cluster(settings: ClusterSettings, data, log_dir: Path) -> SharedCluster:
    """The cluster of `settings` over the built data set `data`, healthy with both workers in rotation."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(settings.env)
    if settings.api_keys:
        keys = log_dir / "api-keys"
        keys.write_text("".join(f"{key}\n" for key in settings.api_keys))
        env["API_KEYS_FILE"] = str(keys)
    slow_index = SlowIndex(log_dir / "search-delay-ms") if settings.slow_index else None
    cluster = SharedCluster(cluster_env(data, **env), log_dir / "logs", slow_index)
    try:
        cluster.start(timeout_s=START_TIMEOUT_S)
    except Exception:
        cluster.stop()
        raise
    return cluster
