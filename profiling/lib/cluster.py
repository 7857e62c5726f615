"""Which cluster a tool measures: every node's address derived from the one URL it was given.

Node 0 is the tool's --url; node 0's /health lists its peers (`"peers": [{"node", "role",
"url"}]`, services/roles/gateway.py), so node 1's and node 2's /metrics are found from the
target itself, never from this machine's NODE_<n>_IP settings (which may describe another
cluster). A node whose /metrics cannot be read is an error that names the node and address:
a figure silently missing a node reads like a node that did nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from profiling.lib.cli import TargetRefused, check_target
from profiling.lib.prometheus import MetricsSnapshot, scrape


class ClusterError(RuntimeError):
    """The cluster's nodes cannot be found or one of them cannot be scraped."""


@dataclass(frozen=True)
class Node:
    node: int
    url: str  # base URL, no trailing slash
    role: str = ""

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    def __str__(self) -> str:
        return f"node {self.node} ({self.metrics_url})"


def nodes_from_health(url: str, health: Mapping[str, Any], allow_remote: bool = False) -> list[Node]:
    """Node 0 at `url` plus the peers its /health lists, in node order.

    Raises ClusterError when node 0 lists no peers (a node older than the `peers` field, or
    not a gateway): the caller should say which nodes to scrape (--metrics-urls).
    """
    peers = health.get("peers")
    if not isinstance(peers, list) or not all(isinstance(p, dict) and "node" in p and "url" in p for p in peers):
        raise ClusterError(f"node 0 ({url}/health) does not list its peers (no 'peers' field: an older node, or "
                           "not node 0?), so its nodes' /metrics cannot be found; give --metrics-urls")
    nodes = [Node(int(health.get("node", 0)), url.rstrip("/"), str(health.get("role", "")))]
    for peer in peers:
        try:
            nodes.append(Node(int(peer["node"]), check_target(str(peer["url"]), allow_remote), str(peer.get("role", ""))))
        except TargetRefused as exc:
            raise ClusterError(f"node {peer['node']}, as node 0's /health gives it: {exc}") from None
    return sorted(nodes, key=lambda n: n.node)


def nodes_from_urls(urls: Sequence[str]) -> list[Node]:
    """Nodes given by hand (--metrics-urls): node n is the n-th URL; a trailing /metrics is dropped."""
    return [Node(n, u.rstrip("/").removesuffix("/metrics")) for n, u in enumerate(urls)]


def describe(snapshot: MetricsSnapshot, node: Node) -> str:
    return f"{node}: {snapshot.error}"


def scrape_nodes(nodes: Sequence[Node], timeout_s: float | None = None) -> list[MetricsSnapshot]:
    """Every node's /metrics; ClusterError naming each node that could not be scraped."""
    snapshots = [scrape(n.metrics_url) if timeout_s is None else scrape(n.metrics_url, timeout_s) for n in nodes]
    check_scraped(nodes, snapshots)
    return snapshots


def check_scraped(nodes: Sequence[Node], snapshots: Sequence[MetricsSnapshot]) -> None:
    failed = [describe(s, n) for n, s in zip(nodes, snapshots) if s.error]
    if failed:
        raise ClusterError("cannot scrape " + "; ".join(failed))
