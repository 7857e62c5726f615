"""Load generator: drives node 0's POST /query (or /v1/chat/completions with --api openai) and reports what the
service did.

Open loop (--schedule, --rate) sends on time whatever the service does, one thread per request as the course client
does, so queueing shows up as latency; `--schedule course` is the course client's three runs (10x10, 20x5, 50x1),
each waiting for its replies before the next starts. Closed loop (--concurrency, --sweep) keeps C requests in
flight, so it finds the throughput the service can sustain. Every run is bounded in count and by --max-duration
(timeouts of requests in flight are cut to end by it); load goes only to loopback addresses unless --allow-remote.

Each node's /metrics (found from node 0's /health unless --metrics-urls) is scraped before the load and after each
phase or level; a node that cannot be scraped stops the tool, naming it. Reports throughput, latency percentiles of
successful requests and their spread, errors by kind (`http_<status>`, the exception class, `invalid_reply`), each
stage's batch sizes, run times and queue waits, peak RSS and cache hits; a sweep level with fewer than 20 successful
requests makes the knee verdict tentative. The summary records the tool's git commit and every node's settings and
rag_node_info, and warns when a cache could answer repeated queries. Writes loadgen_<name>.csv (one row per
request), loadgen_<name>.json (the summary) and PNG plots into --out, or a fresh runs/loadgen-<UTC time>/ folder."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from profiling.lib import load, prometheus, report
from profiling.lib.cli import TargetRefused, add_cluster_args, check_target, comma_list, make_parser, positive
from profiling.lib.plots import write_plots
from profiling.lib.prometheus import ClusterError, Node, NodeDelta
from profiling.lib.provenance import cluster_record, headline, settings_warnings
from profiling.lib.report import GroupResult, RunStats, Saturation, run_stats
from services.cluster.health_wait import wait_healthy

TOOL = "loadgen"


def plan_groups(args: argparse.Namespace) -> tuple[str, list[load.Group]]:
    """The mode's name and its groups (phases or levels), from the parsed arguments."""
    if args.schedule:
        return "schedule", load.parse_schedule(args.schedule, args.time_scale)
    if args.rate is not None:
        return "rate", [load.OpenGroup(f"rate{args.rate:g}", args.count, 1.0 / args.rate)]
    if args.concurrency is not None:
        return "closed", [load.ClosedGroup(f"c{args.concurrency}", args.count, args.concurrency, args.duration)]
    return "sweep", [load.ClosedGroup(f"c{level}", args.count_per_level, level, args.duration) for level in args.sweep]


def default_name(args: argparse.Namespace, mode: str) -> str:
    if args.name:
        return args.name
    if mode == "schedule":
        return "course" if args.schedule.strip().lower() == "course" else "schedule"
    if mode == "rate":
        return f"rate{args.rate:g}"
    return f"closed-c{args.concurrency}" if mode == "closed" else mode


def write_summary(path: Path, summary: dict) -> Path:
    return report.write_json(path, summary, strict=True)  # strict JSON: NaN (no latency yet) as null


# A sweep's levels: order and repeats mean nothing, so they are sorted and deduplicated.
parse_levels = comma_list(int, minimum=1, sort_unique=True, what="concurrency levels", example="1,2,4,8")


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.loadgen", __doc__)
    add_cluster_args(p, TOOL, wait_health_s=300.0)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--schedule", help="'course' (10x10,20x5,50x1) or COUNTxINTERVAL,... (open loop)")
    mode.add_argument("--rate", type=positive(float), help="open loop: requests per second (with --count)")
    mode.add_argument("--concurrency", type=positive(int), help="closed loop: concurrent clients (with --count)")
    mode.add_argument("--sweep", type=parse_levels, help="closed loop at each concurrency level, e.g. 1,2,4,8")
    p.add_argument("--count", type=positive(int), help="requests for --rate / --concurrency")
    p.add_argument("--count-per-level", type=positive(int), help="requests per --sweep level (the knee verdict "
                   f"wants >= {report.MIN_SWEEP_SAMPLE} successful ones)")
    p.add_argument("--duration", type=positive(float), default=None,
                   help="closed loop: stop sending after this many seconds (per level)")
    p.add_argument("--time-scale", type=positive(float), default=1.0, help="multiplies --schedule intervals")
    p.add_argument("--knee-ratio", type=positive(float), default=report.DEFAULT_KNEE_RATIO,
                   help="--sweep: the knee is where p95 grows more than this times throughput's growth")
    p.add_argument("--queries-file", help="one query per line; unset: the SPEC's eight")
    p.add_argument("--timeout", type=positive(float), default=300.0, help="per-request timeout (s), as clients wait")
    p.add_argument("--stream", action="store_true",
                   help="ask for each answer as a stream and report the time to first token and the "
                        "inter-token gap, from the client's side, beside the total latency")
    p.add_argument("--api", choices=("query", "openai"), default="query",
                   help="query: POST /query (greedy, the contract's); openai: POST /v1/chat/completions")
    p.add_argument("--temperature", type=float, default=None,
                   help="--api openai: each request's temperature (unset: the server's default)")
    p.add_argument("--seed-base", type=int, default=None,
                   help="--api openai: request i of a group gets seed N + i (unset: the server draws one)")
    p.add_argument("--max-tokens", type=int, default=None, help="--api openai: each request's max_tokens")
    p.add_argument("--max-duration", type=positive(float), default=1800.0, help="hard limit for the whole run (s)")
    p.add_argument("--name", default=None, help="output name; unset: from the mode (course, sweep, closed-c4...)")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    return p


def chat_load(args: argparse.Namespace) -> load.ChatLoad | None:
    """The /v1 requests' fields, or None for /query."""
    return load.ChatLoad(args.temperature, args.seed_base, args.max_tokens) if args.api == "openai" else None


def validate(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if (args.rate is not None or args.concurrency is not None) and args.count is None:
        p.error("--rate and --concurrency need --count")
    if args.sweep is not None and args.count_per_level is None:
        p.error("--sweep needs --count-per-level")
    if args.schedule:
        try:
            load.parse_schedule(args.schedule)
        except ValueError as exc:
            p.error(str(exc))


@dataclass
class LoadRun:
    """Everything one invocation measured."""
    name: str
    mode: str
    results: list[GroupResult]
    overall: RunStats  # all groups together: first send to last reply, gaps between phases included
    nodes: list[NodeDelta]  # /metrics deltas over the whole invocation
    saturation: Saturation | None  # --sweep only
    deadline_hit: bool  # --max-duration cut the plan short
    caches: dict | None = None  # cache hits/misses over the whole invocation, by cache
    scrape_error: str = ""  # a node that could not be scraped after some phase (the figures lack it)

    @property
    def failed(self) -> bool:
        # A failed request, a node not scraped, or a plan cut by --max-duration;
        # stopping at --duration is a bound the caller chose, not a failure.
        return bool(self.overall.errors) or self.deadline_hit or bool(self.scrape_error)

    def warnings(self) -> list[str]:
        """What the figures should be read with (beside the warnings found before the run)."""
        small = report.small_sample_warning(self.saturation) if self.saturation is not None else ""
        missing = f"{self.scrape_error} after the load: its figures are missing" if self.scrape_error else ""
        return [w for w in (small, missing) if w]


def run(args: argparse.Namespace, url: str, nodes: Sequence[Node], queries: Sequence[str], deadline: float,
        first: Sequence[prometheus.MetricsSnapshot]) -> LoadRun:
    """The plan's groups one after the other; `first`: every node's /metrics before any load."""
    mode, groups = plan_groups(args)
    target = load.LoadTarget(url, queries, args.timeout, deadline, stream=args.stream, chat=chat_load(args))
    before = first
    results, scrape_error = [], ""
    for group in groups:
        if target.past_deadline():
            break
        records = load.run_group(target, group)
        after = [prometheus.scrape(n.metrics_url) for n in nodes]  # per group: each phase or level gets its own deltas
        scrape_error = scrape_error or prometheus.unscraped(nodes, after)  # the first: the later ones follow from it
        results.append(GroupResult(group, records, run_stats(group.name, group.count, records),
                                   prometheus.node_deltas(before, after)))
        print("done: " + report.format_stats_table([results[-1].stats]).splitlines()[-1], file=sys.stderr,
              flush=True)
        before = after
    overall = run_stats("overall", sum(g.count for g in groups), [r for res in results for r in res.records])
    saturation = None
    if mode == "sweep" and results:
        saturation = report.find_saturation([r.group.concurrency for r in results], [r.stats for r in results],
                                            args.knee_ratio)
    return LoadRun(default_name(args, mode), mode, results, overall, prometheus.node_deltas(first, before), saturation,
                   target.deadline_hit, prometheus.cache_deltas(first, before), scrape_error)


def write_outputs(run: LoadRun, args: argparse.Namespace, out: Path, extra: dict) -> list[Path]:
    summary = {
        "name": run.name, "mode": run.mode, **extra,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "overall": run.overall, "deadline_hit": run.deadline_hit,
        "runs": [{"group": r.group, "stats": r.stats, "nodes": r.nodes} for r in run.results],
        "nodes": run.nodes, "caches": run.caches or {}, "saturation": run.saturation,
        "min_sweep_sample": report.MIN_SWEEP_SAMPLE, "warnings": list(extra.get("warnings", [])) + run.warnings(),
    }
    records = [r for res in run.results for r in res.records]
    paths = [report.write_csv(out / f"loadgen_{run.name}.csv", records, load.RequestRecord.columns(), float_digits=6),
             write_summary(out / f"loadgen_{run.name}.json", summary)]
    if not args.no_plots:
        paths += write_plots(out, run.name, run.results, run.saturation)
    return paths


def format_run(run: LoadRun, args: argparse.Namespace) -> str:
    stats = [r.stats for r in run.results] + ([run.overall] if len(run.results) > 1 else [])
    lines = [report.format_stats_table(stats), "latency spread (successful requests):",
             report.format_spread_table(stats)]
    if args.stream:
        lines += ["streamed (client side): time to first token, inter-token gap, total",
                  report.format_stream_table(stats)]
    lines.append(report.format_nodes_table(run.nodes))
    hits = {name: c.get("hits", 0) for name, c in (run.caches or {}).items() if c.get("hits")}
    if hits:
        lines.append("cache hits during the run: " + ", ".join(f"{k} {v:.0f}" for k, v in hits.items())
                     + " (those requests were not computed in full)")
    sat = run.saturation
    if sat is not None:
        verdict = (f"saturation at c={sat.level}: {sat.throughput_rpm:.2f} req/min (knee at c={sat.knee_level})"
                   if sat.reached else
                   f"no knee up to c={run.results[-1].group.concurrency}: saturation not reached; "
                   f"best {sat.max_throughput_rpm:.2f} req/min at c={sat.max_throughput_level}")
        lines.append(f"{verdict}{'' if sat.judgeable else ' (tentative: too few requests)'}\n  rule: {sat.rule}")
    if run.deadline_hit:
        lines.append(f"--max-duration {args.max_duration:g}s reached: "
                     f"{run.overall.planned - run.overall.sent} planned requests were not sent")
    return "\n".join(lines + [f"warning: {line}" for line in run.warnings()])


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    validate(p, args)
    started = time.monotonic()
    deadline = started + args.max_duration
    try:
        url = check_target(args.url, args.allow_remote)
        queries = load.load_queries(args.queries_file)
    except (TargetRefused, OSError, ValueError) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    try:
        # Like the course client: /health must answer 200 before any load is sent.
        health = wait_healthy(url, min(args.wait_health, deadline - time.monotonic()))
        nodes = prometheus.find_nodes(url, args.metrics_urls, args.allow_remote, 0, health)
        first = prometheus.scrape_nodes(nodes)  # before any load: a node we cannot see would make every figure partial
    except (TimeoutError, ClusterError, TargetRefused) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 1
    provenance = cluster_record(nodes, first)
    warnings = settings_warnings(provenance, nodes, queries, sum(g.count for g in plan_groups(args)[1]))
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    out = report.run_folder(TOOL, args.out)
    print(f"loadgen: results go to {out}", file=sys.stderr, flush=True)
    wall_start = time.time()
    measured = run(args, url, nodes, queries, deadline, first)
    paths = write_outputs(measured, args, out, {
        "url": url, "metrics_urls": [n.metrics_url for n in nodes], "started_unix": wall_start,
        "elapsed_s": time.monotonic() - started, "health": health, "provenance": provenance,
        "warnings": warnings})
    print(headline(provenance))
    print(format_run(measured, args))
    for line in warnings:
        print(f"warning: {line}")
    print(f"results in {out}: " + ", ".join(p.name for p in paths))
    return 1 if measured.failed else 0


if __name__ == "__main__":
    sys.exit(main())
