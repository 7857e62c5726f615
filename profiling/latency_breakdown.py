"""One idle request at a time through the cluster, its latency broken down by stage.

    python -m profiling.latency_breakdown --url http://127.0.0.1:8000 [--requests 3]

For each request (sent only after the previous one is answered, so every stage
runs a batch of one) it reads each node's /metrics before and after and
reports every stage's run time on the worker that served it, their sum, the
end-to-end latency, and the ratio of the two: the overhead of batching,
queues and HTTP at low load (the performance target is <= 1.15).
"""
from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path

import requests

from pipeline import spec
from profiling.lib.cli import add_allow_remote, check_target, split_list
from profiling.lib.load import clear_caches
from profiling.lib.prometheus import MetricsSnapshot, counter_delta, scrape
from profiling.lib.report import write_json


def run_seconds(before: MetricsSnapshot, after: MetricsSnapshot, stage: str) -> float:
    """Seconds the stage's batches ran between the two snapshots (0 when not exported)."""
    return counter_delta(before, after, "rag_batch_run_seconds_total", stage=str(stage)) or 0.0


def breakdown(url: str, metrics: dict[int, str], query: str, timeout_s: float, token: str = "") -> dict:
    # A cached embedding would hide the embed stage: start each request cold.
    clear_caches([u.rsplit("/metrics", 1)[0] for u in metrics.values()], token, strict=False, timeout_s=10)
    before = {node: scrape(u) for node, u in metrics.items()}
    started = time.perf_counter()
    response = requests.post(f"{url}/query", json={"request_id": uuid.uuid4().hex, "query": query},
                             timeout=timeout_s)
    latency = time.perf_counter() - started
    response.raise_for_status()
    served_by = response.json().get("served_by", 0)
    after = {node: scrape(u) for node, u in metrics.items()}
    stages = {str(stage): run_seconds(before[served_by], after[served_by], stage) for stage in spec.WORKER_STAGES}
    if 2 in metrics:
        stages["index (node 2)"] = run_seconds(before[2], after[2], spec.Stage.INDEX)
    # Sentiment and toxicity run at the same time: the critical path takes the longer.
    path = sum(v for k, v in stages.items() if k not in ("sentiment", "toxicity", "index (node 2)"))
    path += max(stages["sentiment"], stages["toxicity"])
    return {"query": query, "served_by": served_by, "latency_s": latency, "stages_s": stages,
            "critical_path_s": path, "ratio": latency / path if path else float("nan")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--metrics", default="", help="node=url,... (default: node 0..2 at ports of --url +0/+1/+2)")
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    add_allow_remote(parser)
    parser.add_argument("--token", default="", help="the cluster token, to clear the caches before each request")
    parser.add_argument("--out", default="runs/latency_breakdown")
    args = parser.parse_args(argv)
    url = check_target(args.url, args.allow_remote).rstrip("/")
    if args.metrics:
        metrics = {int(k): v for k, v in (part.split("=", 1) for part in split_list(args.metrics))}
    else:
        host, port = url.rsplit(":", 1)
        metrics = {n: f"{host}:{int(port) + n}/metrics" for n in (0, 1, 2)}
    for u in metrics.values():
        check_target(u, args.allow_remote)
    rows = [breakdown(url, metrics, spec.REFERENCE_QUERIES[i % 8], args.timeout, args.token) for i in range(args.requests)]
    header = ["latency"] + list(rows[0]["stages_s"]) + ["critical path", "latency / path"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        cells = [f"{r['latency_s']:.3f}"] + [f"{v:.3f}" for v in r["stages_s"].values()]
        print("| " + " | ".join(cells + [f"{r['critical_path_s']:.3f}", f"{r['ratio']:.3f}"]) + " |")
    write_json(Path(args.out) / "latency_breakdown.json", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
