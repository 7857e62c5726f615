"""Each node's /metrics: which nodes a tool measures, scraping, and what changed between two snapshots.

The nodes come from the one URL a tool was given: node 0's /health lists its peers (`"peers": [{"node", "role",
"url"}]`), so node 1's and node 2's /metrics are found from the target itself, never from this machine's NODE_<n>_IP
settings (which may describe another cluster). A node whose /metrics cannot be read is an error that names the node
and address: a figure silently missing a node reads like a node that did nothing."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import requests

from pipeline.spec import Stage
from profiling.lib.cli import TargetRefused, check_target, split_list
from services.cluster.health_wait import wait_healthy

SCRAPE_TIMEOUT_S = 10.0
RSS_METRIC = "process_resident_memory_bytes"
PEAK_RSS_METRIC = "rag_process_peak_rss_bytes"

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class MetricsSnapshot:
    url: str
    samples: dict[SampleKey, float]
    error: str = ""  # why there are no samples ("http_404", "ConnectionError", ...)

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def label_values(self, name: str, label: str) -> list[str]:
        return sorted({dict(lbl)[label] for (n, lbl) in self.samples if n == name and label in dict(lbl)})


def parse_metrics(text: str) -> dict[SampleKey, float]:
    """Prometheus text into {(sample name, sorted labels): value}; sample names keep their
    suffixes (_total, _count, _sum, _bucket), so counters and histograms read the same way."""
    from prometheus_client.parser import text_string_to_metric_families
    return {(s.name, tuple(sorted(s.labels.items()))): float(s.value)
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(url: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> MetricsSnapshot:
    """GET a /metrics URL; a failure is an empty snapshot that says why, never an exception."""
    try:
        response = requests.get(url, timeout=timeout_s)
    except requests.RequestException as exc:
        return MetricsSnapshot(url, {}, type(exc).__name__)
    if response.status_code != 200:
        return MetricsSnapshot(url, {}, f"http_{response.status_code}")
    try:
        return MetricsSnapshot(url, parse_metrics(response.text))
    except ValueError as exc:  # not Prometheus text
        return MetricsSnapshot(url, {}, f"unparsable: {exc}")


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
    """Node 0 at `url` plus the peers its /health lists, in node order; ClusterError when it lists none."""
    peers = health.get("peers")
    if not isinstance(peers, list) or not all(isinstance(p, dict) and "node" in p and "url" in p for p in peers):
        raise ClusterError(f"node 0 ({url}/health) does not list its peers (no 'peers' field: an older node, or "
                           "not node 0?), so its nodes' /metrics cannot be found; give --metrics-urls")
    nodes = [Node(int(health.get("node", 0)), url.rstrip("/"), str(health.get("role", "")))]
    for peer in peers:
        try:
            url_of_peer = check_target(str(peer["url"]), allow_remote)
        except TargetRefused as exc:
            raise ClusterError(f"node {peer['node']}, as node 0's /health gives it: {exc}") from None
        nodes.append(Node(int(peer["node"]), url_of_peer, str(peer.get("role", ""))))
    return sorted(nodes, key=lambda n: n.node)


def find_nodes(url: str, listed: str | None, allow_remote: bool, wait_s: float,
               health: Mapping[str, Any] | None = None) -> list[Node]:
    """The nodes to scrape. `listed`: 'URL,...' (node n is the n-th) or 'N=URL,...', a trailing /metrics
    dropped; 'none': no node; empty: node 0 at `url` and the peers its /health (`health`, else waited
    for up to wait_s) lists."""
    items = split_list(listed or "")
    if not items:
        return nodes_from_health(url, wait_healthy(url, wait_s) if health is None else health, allow_remote)
    if [item.lower() for item in items] == ["none"]:
        return []
    pairs = [item.split("=", 1) if "=" in item else (n, item) for n, item in enumerate(items)]
    return sorted((Node(int(n), check_target(u, allow_remote).removesuffix("/metrics")) for n, u in pairs),
                  key=lambda n: n.node)


def unscraped(nodes: Sequence[Node], snapshots: Sequence[MetricsSnapshot]) -> str:
    """'' when every node was scraped, else 'cannot scrape node N (URL): why; ...'."""
    failed = [f"{n}: {s.error}" for n, s in zip(nodes, snapshots) if s.error]
    return "cannot scrape " + "; ".join(failed) if failed else ""


def scrape_nodes(nodes: Sequence[Node], timeout_s: float = SCRAPE_TIMEOUT_S) -> list[MetricsSnapshot]:
    """Every node's /metrics; ClusterError naming each node that could not be scraped."""
    snapshots = [scrape(n.metrics_url, timeout_s) for n in nodes]
    if failed := unscraped(nodes, snapshots):
        raise ClusterError(failed)
    return snapshots


@dataclass(frozen=True)
class StageDelta:
    stage: str
    batches: float
    items: float
    mean_batch_size: float
    mean_batch_run_s: float  # per batch
    mean_item_wait_s: float  # per item, submit to batch start
    queue_depth_after: float | None
    # The continuous generate stage's decode steps during the run and the sequences summed over them (None for
    # the other stages): its batches are admissions, so its run time over its steps is the engine's time a step.
    decode_steps: float | None = None
    step_sequences: float | None = None


@dataclass(frozen=True)
class NodeDelta:
    url: str
    error: str
    peak_rss_bytes: float | None
    rss_bytes: float | None
    stages: list[StageDelta]
    http_requests: dict[str, float]  # "endpoint status" -> count during the run


def counter_delta(before: MetricsSnapshot, after: MetricsSnapshot, *names: str, **labels: str) -> float | None:
    """after - before of the first of `names` that the node exports (counters, histogram sums)."""
    for name in names:
        a = after.get(name, **labels)
        if a is not None:
            return a - (before.get(name, **labels) or 0.0)
    return None


def _ratio(num: float | None, den: float | None) -> float:
    return num / den if num is not None and den else math.nan


def stage_delta(before: MetricsSnapshot, after: MetricsSnapshot, stage: str) -> StageDelta:
    batches = counter_delta(before, after, "rag_batch_size_count", "rag_batches_total", stage=stage)
    # Items taken off the stage's queue, and items summed over its batches (the histogram's
    # sum): the two agree for every stage (a continuous generate batch is the requests
    # admitted together; its decode steps are the rag_generate_* families). Older nodes
    # counted decode steps as generate's batches, so each is read on its own.
    items = counter_delta(before, after, "rag_batch_items_total", "rag_batch_size_sum", stage=stage)
    batched = counter_delta(before, after, "rag_batch_size_sum", "rag_batch_items_total", stage=stage)
    run_s = counter_delta(before, after, "rag_batch_run_seconds_total", stage=stage)
    wait_s = counter_delta(before, after, "rag_batch_wait_seconds_total", stage=stage)
    steps = counter_delta(before, after, "rag_generate_decode_steps_total", stage=stage)
    sequences = counter_delta(before, after, "rag_generate_step_sequences_sum", stage=stage)
    return StageDelta(stage, batches or 0.0, items or 0.0, _ratio(batched, batches), _ratio(run_s, batches),
                      _ratio(wait_s, items), after.get("rag_batch_queue_depth", stage=stage), steps, sequences)


def http_deltas(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, float]:
    """{"endpoint status": requests during the run}, for the pairs that changed."""
    http = {}
    for (name, labels), value in after.samples.items():
        count = value - (before.samples.get((name, labels)) or 0.0)
        if name == "rag_http_requests_total" and count:
            http[f"{dict(labels).get('endpoint', '?')} {dict(labels).get('status', '?')}"] = count
    return dict(sorted(http.items()))


def node_delta(before: MetricsSnapshot, after: MetricsSnapshot) -> NodeDelta:
    if after.error:
        return NodeDelta(after.url, after.error, None, None, [], {})
    names = after.label_values("rag_batch_size_count", "stage") or after.label_values("rag_batches_total", "stage")
    order = list(Stage)  # pipeline order reads better than alphabetical; unknown stages go last
    stages = [stage_delta(before, after, stage)
              for stage in sorted(names, key=lambda s: (order.index(s) if s in order else len(order), s))]
    return NodeDelta(after.url, "", after.get(PEAK_RSS_METRIC), after.get(RSS_METRIC), stages,
                     http_deltas(before, after))


def node_deltas(before: Sequence[MetricsSnapshot], after: Sequence[MetricsSnapshot]) -> list[NodeDelta]:
    return [node_delta(b, a) for b, a in zip(before, after)]


CACHE_NAMES = ("embedding", "response")  # the `cache` label of the caches that can answer a query


def cache_deltas(before: Sequence[MetricsSnapshot], after: Sequence[MetricsSnapshot]) -> dict[str, dict[str, float]]:
    """Hits, misses (joins included), joins and evictions of each cache over a run, summed over the nodes."""
    totals: dict[str, dict[str, float]] = {}
    for b, a in zip(before, after):
        for cache in CACHE_NAMES:
            for kind in ("hits", "misses", "joined", "evictions"):
                delta = counter_delta(b, a, f"rag_cache_{kind}_total", cache=cache)
                if delta is not None:
                    totals.setdefault(cache, {})[kind] = totals.get(cache, {}).get(kind, 0.0) + delta
    return totals
