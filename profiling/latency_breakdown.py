"""One idle request at a time through the cluster, its latency broken down by stage.

    python -m profiling.latency_breakdown --url http://127.0.0.1:8000 [--requests 3] [--out DIR]

For each request (sent only after the previous one is answered, so every stage
runs a batch of one) it reads each node's /metrics before and after and
reports every stage's run time on the worker that served it, their sum, the
end-to-end latency, and the ratio of the two: the overhead of batching,
queues and HTTP at low load (the performance target is <= 1.15).

The nodes are found from --url (node 0's /health lists its peers) unless
--metrics names them; a node whose /metrics cannot be read stops the tool
with a message naming it (exit 1). The caches are cleared before each
request; a node that refuses (e.g. without --token) is warned about. Writes
latency_breakdown.json (the rows, the tool's git commit, every node's
settings and rag_node_info, warnings) into --out, or a fresh
runs/latency_breakdown-<UTC time>/ folder.
"""
from __future__ import annotations

import sys
import time
import uuid
from typing import Sequence

import requests

from pipeline import spec
from profiling.lib.cli import TargetRefused, add_allow_remote, add_out, check_target, make_parser, split_list
from profiling.lib.cluster import ClusterError, Node, nodes_from_health, scrape_nodes
from profiling.lib.load import clear_caches
from profiling.lib.prometheus import MetricsSnapshot, counter_delta
from profiling.lib.provenance import cluster_record, headline, settings_warnings
from profiling.lib.report import run_folder, write_json
from services.cluster.health_wait import wait_healthy

TOOL = "latency_breakdown"


def run_seconds(before: MetricsSnapshot, after: MetricsSnapshot, stage: str) -> float:
    """Seconds the stage's batches ran between the two snapshots (0 when not exported)."""
    return counter_delta(before, after, "rag_batch_run_seconds_total", stage=str(stage)) or 0.0


def breakdown(url: str, nodes: Sequence[Node], query: str, timeout_s: float, token: str = "",
              warnings: list[str] | None = None) -> dict:
    # A cached embedding would hide the embed stage: start each request cold.
    refused = clear_caches([n.url for n in nodes], token, strict=False, timeout_s=10)
    if refused and warnings is not None:
        warnings.extend(f"caches not cleared on {why}: a cache may have answered part of a request"
                        for why in refused if not any(why in w for w in warnings))
    by_node = {n.node: i for i, n in enumerate(nodes)}
    before = scrape_nodes(nodes)
    started = time.perf_counter()
    response = requests.post(f"{url}/query", json={"request_id": uuid.uuid4().hex, "query": query},
                             timeout=timeout_s)
    latency = time.perf_counter() - started
    response.raise_for_status()
    served_by = response.json().get("served_by", 0)
    after = scrape_nodes(nodes)
    if served_by not in by_node:
        raise ClusterError(f"node {served_by} served the request but is not among the nodes scraped")
    w = by_node[served_by]
    stages = {str(stage): run_seconds(before[w], after[w], stage) for stage in spec.WORKER_STAGES}
    if 2 in by_node:
        stages["index (node 2)"] = run_seconds(before[by_node[2]], after[by_node[2]], spec.Stage.INDEX)
    # Sentiment and toxicity run at the same time: the critical path takes the longer.
    path = sum(v for k, v in stages.items() if k not in ("sentiment", "toxicity", "index (node 2)"))
    path += max(stages["sentiment"], stages["toxicity"])
    return {"query": query, "served_by": served_by, "latency_s": latency, "stages_s": stages,
            "critical_path_s": path, "ratio": latency / path if path else float("nan")}


def parser():
    p = make_parser("python -m profiling.latency_breakdown", __doc__)
    p.add_argument("--url", required=True, help="node 0's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--metrics", default="",
                   help="node=url,... (base URLs) to scrape instead; empty: node 0 at --url and the peers its "
                        "/health lists")
    p.add_argument("--requests", type=int, default=3, help="requests, one at a time")
    p.add_argument("--timeout", type=float, default=600, help="per-request timeout (s)")
    p.add_argument("--wait-health", type=float, default=60.0, help="how long to wait for node 0's /health 200 (s)")
    add_allow_remote(p)
    p.add_argument("--token", default="", help="the cluster token, to clear the caches before each request")
    add_out(p, TOOL)
    return p


def find_nodes(args, url: str) -> list[Node]:
    if args.metrics:
        pairs = (part.split("=", 1) for part in split_list(args.metrics))
        return sorted((Node(int(k), check_target(v, args.allow_remote).removesuffix("/metrics")) for k, v in pairs),
                      key=lambda n: n.node)
    return nodes_from_health(url, wait_healthy(url, args.wait_health), args.allow_remote)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        url = check_target(args.url, args.allow_remote)
        nodes = find_nodes(args, url)
        provenance = cluster_record(nodes, scrape_nodes(nodes), args.token)
    except (TargetRefused, ValueError) as exc:
        print(f"latency_breakdown: {exc}", file=sys.stderr)
        return 2
    except (ClusterError, TimeoutError) as exc:
        print(f"latency_breakdown: {exc}", file=sys.stderr)
        return 1
    warnings = settings_warnings(provenance)
    out = run_folder(TOOL, args.out)
    try:
        rows = [breakdown(url, nodes, spec.REFERENCE_QUERIES[i % 8], args.timeout, args.token, warnings)
                for i in range(args.requests)]
    except ClusterError as exc:
        print(f"latency_breakdown: {exc}", file=sys.stderr)
        return 1
    header = ["latency"] + list(rows[0]["stages_s"]) + ["critical path", "latency / path"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        cells = [f"{r['latency_s']:.3f}"] + [f"{v:.3f}" for v in r["stages_s"].values()]
        print("| " + " | ".join(cells + [f"{r['critical_path_s']:.3f}", f"{r['ratio']:.3f}"]) + " |")
    print(headline(provenance))
    for line in warnings:
        print(f"warning: {line}")
    path = write_json(out / "latency_breakdown.json", {"url": url, "rows": rows, "provenance": provenance,
                                                       "warnings": warnings})
    print(f"results in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
