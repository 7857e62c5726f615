"""One idle request at a time through the cluster, its latency broken down by stage.

For each request (sent only after the previous one is answered, so every stage runs a batch of one) it reads each
node's /metrics before and after and reports every stage's run time on the worker that served it, their sum, the
end-to-end latency, and the ratio of the two: the overhead of batching, queues and HTTP at low load (the performance
target is <= 1.15); and generate's own split: its time from submit to the first token (alone: the prompt's
prefill) and its decode steps with their mean time (the engine's iterations over the steps it counted).

A node whose /metrics (found from node 0's /health unless --metrics) cannot be read stops the tool, naming it (exit
1). The caches are cleared before each request; a node that refuses (e.g. without --token) is warned about. Writes
latency_breakdown.json (the rows, the tool's git commit, every node's settings, warnings) into --out, or a fresh
runs/latency_breakdown-<UTC time>/ folder."""
from __future__ import annotations

import sys
import time
import uuid
from typing import Sequence

import requests

from pipeline import spec
from profiling.lib.cli import add_cluster_args, check_target, make_parser
from profiling.lib.prometheus import ClusterError, MetricsSnapshot, Node, counter_delta, find_nodes, scrape_nodes
from profiling.lib.provenance import cluster_record, headline, settings_warnings
from profiling.lib.report import run_folder, write_json
from services.server.token import TOKEN_HEADER

TOOL = "latency_breakdown"


def run_seconds(before: MetricsSnapshot, after: MetricsSnapshot, stage: str) -> float:
    """Seconds the stage's batches ran between the two snapshots (0 when not exported)."""
    return counter_delta(before, after, "rag_batch_run_seconds_total", stage=str(stage)) or 0.0


def generate_split(before: MetricsSnapshot, after: MetricsSnapshot, run_s: float) -> dict[str, float]:
    """The generate stage's time to first token (s), decode steps and mean ms an engine iteration (its `run_s`
    seconds over the steps) between the two snapshots of the worker that served one request (NaN where nothing
    was counted)."""
    labels = {"stage": str(spec.Stage.GENERATE)}
    firsts = counter_delta(before, after, "rag_generate_ttft_seconds_count", **labels) or 0.0
    ttft = counter_delta(before, after, "rag_generate_ttft_seconds_sum", **labels) or 0.0
    steps = counter_delta(before, after, "rag_generate_decode_steps_total", **labels) or 0.0
    return {"first_token_s": ttft / firsts if firsts else float("nan"), "decode_steps": steps,
            "step_ms": 1000 * run_s / steps if steps else float("nan")}


def clear_caches(nodes: Sequence[Node], token: str, warnings: list[str]) -> None:
    """POST /cache/clear on each node (an internal endpoint: the cluster token when set), so a request
    starts cold: a cached embedding would hide the embed stage. A node that refuses is warned about once."""
    for node in nodes:
        try:
            requests.post(f"{node.url}/cache/clear", headers={TOKEN_HEADER: token} if token else {},
                          timeout=10).raise_for_status()
        except requests.RequestException as exc:
            why = f"{node.url}: {type(exc).__name__}"
            if not any(why in w for w in warnings):
                warnings.append(f"caches not cleared on {why}: a cache may have answered part of a request")


def breakdown(url: str, nodes: Sequence[Node], query: str, timeout_s: float, token: str, warnings: list[str]) -> dict:
    clear_caches(nodes, token, warnings)
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
            "critical_path_s": path, "ratio": latency / path if path else float("nan"),
            "generate": generate_split(before[w], after[w], stages[str(spec.Stage.GENERATE)])}


def parser():
    p = make_parser("python -m profiling.latency_breakdown", __doc__)
    add_cluster_args(p, TOOL, wait_health_s=60.0, metrics="--metrics")
    p.add_argument("--requests", type=int, default=3, help="requests, one at a time")
    p.add_argument("--timeout", type=float, default=600, help="per-request timeout (s)")
    p.add_argument("--token", default="", help="the cluster token, to clear the caches before each request")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        url = check_target(args.url, args.allow_remote)
        nodes = find_nodes(url, args.metrics, args.allow_remote, args.wait_health)
        provenance = cluster_record(nodes, scrape_nodes(nodes), args.token)
    except (ValueError, ClusterError, TimeoutError) as exc:  # TargetRefused is a ValueError
        print(f"latency_breakdown: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    warnings = settings_warnings(provenance)
    out = run_folder(TOOL, args.out)
    try:
        rows = [breakdown(url, nodes, spec.REFERENCE_QUERIES[i % 8], args.timeout, args.token, warnings)
                for i in range(args.requests)]
    except ClusterError as exc:
        print(f"latency_breakdown: {exc}", file=sys.stderr)
        return 1
    header = (["latency"] + list(rows[0]["stages_s"])
              + ["critical path", "latency / path", "generate: first token", "decode steps", "ms a step"])
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        cells = [f"{r['latency_s']:.3f}"] + [f"{v:.3f}" for v in r["stages_s"].values()]
        split = r["generate"]
        print("| " + " | ".join(cells + [f"{r['critical_path_s']:.3f}", f"{r['ratio']:.3f}", f"{split['first_token_s']:.3f}",
                                         f"{split['decode_steps']:.0f}", f"{split['step_ms']:.1f}"]) + " |")
    print(headline(provenance))
    for line in warnings:
        print(f"warning: {line}")
    path = write_json(out / "latency_breakdown.json", {"url": url, "rows": rows, "provenance": provenance,
                                                       "warnings": warnings})
    print(f"results in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
