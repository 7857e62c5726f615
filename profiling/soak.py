"""Soak benchmark: steady load for N minutes while watching every node's memory.

A leak shows as resident memory that keeps climbing under a load that does not change. So the load is steady (closed
loop: C clients, each sending its next request when its reply arrives; or open loop: R requests per second whatever
the replies do), and every few seconds each node's `/metrics` is scraped for `process_resident_memory_bytes`. The
report compares, per node, the mean RSS of the first minute (the baseline: models loaded, batches warmed, allocator
pools grown) with the mean of the last minute (runs shorter than 3 minutes use thirds instead) and flags growth over
5 %. It also counts errors by kind (`http_<status>`, the exception class, or `invalid_reply`).

Bounded in count and time: no request is sent after --minutes, requests in flight then get at most --drain-s more,
every thread is joined with a timeout. Each node (found from node 0's /health unless --metrics-urls) must answer
/metrics before the load starts; one whose /metrics failed during the run makes the exit status 1 (its memory figure
is incomplete). The summary records the tool's git commit and each node's settings, and warns when a cache could
answer the repeated queries. Writes soak_<name>.json (the summary), soak_<name>_rss.csv (one row per node per
sample) and soak_<name>_requests.csv (one row per request) into --out, or a fresh runs/soak-<UTC time>/ folder."""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from profiling.lib import load
from profiling.lib.cli import add_cluster_args, check_target, make_parser, positive
from profiling.lib.prometheus import RSS_METRIC, ClusterError, Node, find_nodes, scrape, scrape_nodes
from profiling.lib.provenance import cluster_record, headline, settings_warnings
from profiling.lib.report import percentiles, run_folder, write_csv, write_json

TOOL = "soak"
GROWTH_GOAL_PCT = 5.0
BASELINE_S = 60.0
SCRAPE_TIMEOUT_S = 5.0

@dataclass
class RssSample:
    t_s: float
    node_url: str
    rss_bytes: float | None  # None: the scrape failed (counted, not fatal)


def run_load(target: load.LoadTarget, stop_sending_at: float, args: argparse.Namespace) -> list[load.RequestRecord]:
    """The library's closed loop (C clients) or open loop (R per second, at most
    --max-outstanding out at once), bounded by --max-requests, --minutes and the drain."""
    if args.rate:
        return load.run_open(target, load.OpenGroup("soak", args.max_requests, 1.0 / args.rate),
                             send_until=stop_sending_at, max_outstanding=args.max_outstanding)
    duration = stop_sending_at - time.monotonic()
    return load.run_closed(target, load.ClosedGroup("soak", args.max_requests, args.concurrency, duration))


def answered(records: list[load.RequestRecord]) -> list[dict]:
    """soak_<name>_requests.csv's rows: the requests that got an answer (one still out at the hard end was sent, not
    answered), each with its outcome: "ok", "http_<status>", an exception class, or "invalid_reply"."""
    return [{"sent_s": r.send_s, "latency_s": r.latency_s, "outcome": r.error or "ok"} for r in records if r.finished]


def scrape_rss(url: str) -> float | None:
    """The node's resident memory from its /metrics (None: the scrape failed)."""
    return scrape(f"{url}/metrics", timeout_s=SCRAPE_TIMEOUT_S).get(RSS_METRIC)


def sampler(target: load.LoadTarget, urls: list[str], every_s: float, samples: list[RssSample], stop: threading.Event):
    while not stop.is_set() and time.monotonic() < target.deadline:
        t = target.now_s()
        for url in urls:
            samples.append(RssSample(round(t, 2), url, scrape_rss(url)))
        stop.wait(every_s)


def growth(samples: list[RssSample], urls: list[str], duration_s: float) -> dict[str, dict]:
    """Per node: baseline (first minute, or first third) vs end (last minute, or last third)."""
    window = BASELINE_S if duration_s >= 3 * BASELINE_S else duration_s / 3
    result = {}
    for url in urls:
        points = [(s.t_s, s.rss_bytes) for s in samples if s.node_url == url and s.rss_bytes is not None]
        first = [v for t, v in points if t <= window]
        last = [v for t, v in points if t >= duration_s - window]
        if not first or not last:
            result[url] = {"samples": len(points), "growth_pct": None, "ok": None}
            continue
        base, end = float(np.mean(first)), float(np.mean(last))
        pct = 100.0 * (end - base) / base
        result[url] = {"samples": len(points), "baseline_mib": round(base / 2**20, 1),
                       "end_mib": round(end / 2**20, 1), "peak_mib": round(max(v for _, v in points) / 2**20, 1),
                       "growth_pct": round(pct, 2), "ok": pct < GROWTH_GOAL_PCT}
    return result


def summarize(target: load.LoadTarget, sent: int, records: list[dict], samples: list[RssSample], urls: list[str],
              args: argparse.Namespace) -> dict:
    duration_s = min(target.now_s(), args.minutes * 60.0)
    outcomes = Counter(r["outcome"] for r in records)
    ok_latencies = [r["latency_s"] for r in records if r["outcome"] == "ok"]
    errors = {k: v for k, v in outcomes.items() if k != "ok"}
    memory = growth(samples, urls, duration_s)
    return {
        "url": target.url, "mode": f"rate {args.rate}/s" if args.rate else f"closed loop x{args.concurrency}",
        "minutes": args.minutes, "ran_s": round(target.now_s(), 1), "sent": sent,
        "answered": len(records), "ok": outcomes.get("ok", 0), "error_count": sum(errors.values()),
        "errors": errors,
        "latency_s": ({f"p{q}": round(v, 3) for q, v in zip((50, 95, 99), percentiles(ok_latencies))}
                      if ok_latencies else {}),
        "throughput_per_min": round(60.0 * len(ok_latencies) / max(duration_s, 1e-9), 1),
        "rss_growth_goal_pct": GROWTH_GOAL_PCT, "rss": memory,
        "rss_ok": all(m["ok"] for m in memory.values()) if memory else None,
        "scrape_failures": sum(1 for s in samples if s.rss_bytes is None),
    }


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.soak", __doc__)
    add_cluster_args(p, TOOL, wait_health_s=300.0)
    p.add_argument("--minutes", type=positive(float), default=10.0, help="how long to send load")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=positive(int), default=4, help="closed loop: this many clients")
    mode.add_argument("--rate", type=positive(float), default=None, help="open loop: requests per second")
    p.add_argument("--max-outstanding", type=positive(int), default=256, help="open loop: most requests out at once")
    p.add_argument("--max-requests", type=positive(int), default=1_000_000, help="hard cap on requests sent")
    p.add_argument("--sample-s", type=positive(float), default=5.0, help="seconds between RSS samples")
    p.add_argument("--timeout", type=positive(float), default=300.0, help="per-request timeout (s)")
    p.add_argument("--drain-s", type=float, default=30.0, help="after --minutes, how long requests out may take")
    p.add_argument("--name", default=time.strftime("%Y%m%d-%H%M%S"), help="output name (the start time)")
    return p


def scrape_failures(samples: list[RssSample], nodes: list[Node]) -> list[str]:
    """One line per node whose /metrics failed at some sample: its memory figure is incomplete."""
    taken, failed = Counter(s.node_url for s in samples), Counter(s.node_url for s in samples if s.rss_bytes is None)
    return [f"{n} could not be scraped at {failed[n.url]} of {taken[n.url]} samples" for n in nodes if failed[n.url]]


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.drain_s < 0:
        p.error("--drain-s must be >= 0")
    try:
        url = check_target(args.url, args.allow_remote)
        nodes = find_nodes(url, args.metrics_urls, args.allow_remote, args.wait_health)
        first = scrape_nodes(nodes)  # every node visible before any load, or no soak at all
    except (ValueError, ClusterError, TimeoutError) as exc:  # TargetRefused is a ValueError
        print(f"soak: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    urls = [n.url for n in nodes]
    provenance = cluster_record(nodes, first)
    queries = load.load_queries(None)
    warnings = settings_warnings(provenance, nodes, queries, args.max_requests)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    out = run_folder(TOOL, args.out)
    started = time.monotonic()
    stop_sending_at = started + args.minutes * 60.0
    # The deadline, --drain-s later, cuts request timeouts so nothing outlives the run; a timeout
    # so cut keeps its exception's name (cut_error=None), as any timeout does.
    target = load.LoadTarget(url, queries, args.timeout, stop_sending_at + args.drain_s, t0=started,
                             id_prefix="soak", cut_error=None)
    samples: list[RssSample] = []
    stop = threading.Event()
    watcher = threading.Thread(target=sampler, args=(target, urls, args.sample_s, samples, stop), daemon=True)
    print(f"soak: {args.minutes:g} min against {url}, RSS of {len(urls)} nodes every {args.sample_s:g}s; "
          f"results go to {out}", flush=True)
    watcher.start()
    sent = run_load(target, stop_sending_at, args)  # returns by the deadline plus the join grace
    stop.set()
    watcher.join(timeout=SCRAPE_TIMEOUT_S * len(urls) + load.JOIN_GRACE_S)
    end = round(min(target.now_s(), args.minutes * 60.0), 2)  # one last sample, as the load ends
    samples.extend(RssSample(end, u, scrape_rss(u)) for u in urls)
    records = answered(list(sent))  # a copy: a thread past its join timeout may still finish a record
    samples = list(samples)  # a copy: the watcher may outlive its join timeout
    failures = scrape_failures(samples, nodes)
    summary = summarize(target, len(sent), records, samples, urls, args)
    summary.update({"nodes": [{"node": n.node, "url": n.url, "role": n.role} for n in nodes],
                    "provenance": provenance, "warnings": warnings + failures})
    paths = [write_json(out / f"soak_{args.name}.json", summary),
             write_csv(out / f"soak_{args.name}_rss.csv", samples, list(RssSample.__dataclass_fields__)),
             write_csv(out / f"soak_{args.name}_requests.csv", records, ["sent_s", "latency_s", "outcome"])]
    print(json.dumps({k: v for k, v in summary.items() if k != "provenance"}, indent=2))  # the file has all
    print(headline(provenance))
    for line in failures:
        print(f"soak: {line}", file=sys.stderr)
    print(f"soak: results in {out}: " + ", ".join(p.name for p in paths))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
