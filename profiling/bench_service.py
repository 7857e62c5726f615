"""The whole service under closed-loop load, in several configurations, side by side.

    python -m profiling.bench_service --compare batching|threads|cache|precision|workers
        [--concurrency 16] [--count 32] [--warmup 2] [--variants a,b] [--base-port 8500]
        [--max-duration 1800] [--out DIR] [--name NAME]

For each configuration ("variant") of the chosen comparison this starts a fresh
local three-node cluster (`tools.local`, separate processes on
127.0.0.1, the environment's data and models: `STANDIN_PROFILE=faithful
MODEL_SOURCE=standin` for faithful figures), sends `--warmup` requests, clears
the caches, then keeps `--concurrency` clients busy for `--count` requests, and
stops the cluster. The variants run one after the other on the same machine
and the same request plan, and the report gives each one's throughput,
latency, per-stage batching from /metrics, peak RSS, cache hits, and its
throughput as a ratio of the first variant's (the baseline):

- batching: `unbatched` (every stage's max batch 1, `GENERATE_MODE=static`, so
  one sequence at a time) against `batched` (the env.example defaults);
- threads: `budget` (what `./run.sh local` picks: the cores split between the
  two workers, one faiss thread, HTTP threads from the in-flight limit) against
  `library-defaults` (torch and faiss on every core in each process, waitress's
  4 HTTP threads), `cores-per-worker` (the budget, but each worker's torch on
  every core) and `one-per-stage` (one torch and one faiss thread). Variants
  whose thread settings come out the same on this machine run once;
- cache: `no-cache` against `embed-cache` and `response-cache` on a workload
  that repeats the queries (the SPEC's eight, or `--queries-file`);
- precision: `exact` (`PRECISION=exact`) against `fast` (`PRECISION=fast`, the
  FAST table's variant per stage; `profiling/select_variants.py` measures the
  variants one stage at a time), every `*_PRECISION` override cleared;
- workers: `2-workers` (today's cluster) against `3-workers` and `4-workers`
  (tools.local.local_topology: one index node after the workers), the
  machine's cores split between the workers as `./run.sh local` splits them.

The batching, threads and precision comparisons run with both caches off. Every run is
bounded in count and in time (`--max-duration` per variant) and only sends to
loopback addresses. A node whose /metrics cannot be read fails its variant (named
in the report). The summary records the tool's git commit and, per variant, every
node's settings (GET /settings, 'unknown' where missing) and rag_node_info, with a
warning when a cache could answer the repeated queries (outside --compare cache).
Writes bench_service_<name>.json and the nodes' logs into --out, or a fresh
runs/bench_service-<UTC time>/ folder.
"""
from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import requests

from pipeline.config import REPO_ROOT, ConfigError, Settings
from pipeline.device import thread_budget
from pipeline.spec import MODEL_STAGES, Stage
from profiling.lib.cli import add_out, make_parser, split_list
from profiling.lib.cluster import ClusterError, Node, check_scraped
from profiling.lib.load import ClosedGroup, LoadTarget, clear_caches, load_queries, run_closed
from profiling.lib.prometheus import NodeDelta, cache_deltas, node_deltas, scrape_all  # noqa: F401 (cache_deltas: its old home)
from profiling.lib.provenance import cache_warnings, cluster_record, git_commit, node_settings, settings_warnings
from profiling.lib.report import RunStats, format_nodes_table, jsonable, mib, run_folder, run_stats, write_json
from tools.local import LocalCluster, free_ports, local_topology, pinned_env

TOOL = "bench_service"
DEMO_DIR = REPO_ROOT / "data" / "demo"
CACHES_OFF = {"EMBED_CACHE_SIZE": "0", "RESPONSE_CACHE_SIZE": "0"}
THREAD_VARS = ("TORCH_THREADS", "FAISS_THREADS", "WAITRESS_THREADS")
WAITRESS_DEFAULT_THREADS = "4"  # waitress.serve(threads=4) when nobody says otherwise


@dataclass(frozen=True)
class Variant:
    name: str
    env: dict[str, str]
    what: str


def batching_variants(cores: int) -> list[Variant]:
    one_at_a_time = {f"{stage.upper()}_MAX_BATCH": "1" for stage in Stage}
    return [
        Variant("unbatched", {**CACHES_OFF, **one_at_a_time, "GENERATE_MODE": "static"},
                "every stage's max batch 1, one sequence at a time through generate()"),
        Variant("batched", dict(CACHES_OFF), "the env.example defaults (continuous batching for generate)"),
    ]


def thread_variants(cores: int) -> list[Variant]:
    return [
        Variant("budget", {**CACHES_OFF, **{v: "0" for v in THREAD_VARS}},
                f"{max(1, cores // 2)} torch thread(s) per worker ({cores} cores split in two), 1 faiss thread, "
                "HTTP threads from the in-flight limit"),
        Variant("library-defaults", {**CACHES_OFF, "TORCH_THREADS": str(cores), "FAISS_THREADS": str(cores),
                                     "WAITRESS_THREADS": WAITRESS_DEFAULT_THREADS},
                f"what torch, faiss and waitress pick alone: {cores} torch and {cores} faiss threads in every "
                "process, 4 HTTP threads"),
        Variant("cores-per-worker", {**CACHES_OFF, "TORCH_THREADS": str(cores), "FAISS_THREADS": "0",
                                     "WAITRESS_THREADS": "0"},
                f"every worker on all {cores} cores (TORCH_THREADS=0 when each node has its own machine), "
                "otherwise the budget"),
        Variant("one-per-stage", {**CACHES_OFF, "TORCH_THREADS": "1", "FAISS_THREADS": "1", "WAITRESS_THREADS": "0"},
                "one torch thread per stage thread, one faiss thread, HTTP threads from the in-flight limit"),
    ]


def cache_variants(cores: int) -> list[Variant]:
    return [
        Variant("no-cache", dict(CACHES_OFF), "no cache"),
        Variant("embed-cache", {"EMBED_CACHE_SIZE": "1024", "RESPONSE_CACHE_SIZE": "0"},
                "the workers' query-embedding LRU (the default)"),
        Variant("response-cache", {"EMBED_CACHE_SIZE": "1024", "RESPONSE_CACHE_SIZE": "1024"},
                "plus node 0's reply cache by normalised query"),
    ]


# Every per-stage override empty: each stage follows PRECISION, whatever the caller's environment says.
FOLLOW_PRECISION = {f"{stage.upper()}_PRECISION": "" for stage in MODEL_STAGES}


def precision_variants(cores: int) -> list[Variant]:
    return [
        Variant("exact", {**CACHES_OFF, **FOLLOW_PRECISION, "PRECISION": "exact"},
                "every model in its *_DTYPE (float32, or bfloat16 where DTYPE=auto picks it)"),
        Variant("fast", {**CACHES_OFF, **FOLLOW_PRECISION, "PRECISION": "fast"},
                "each stage's variant in pipeline/precision.py FAST for this hardware"),
    ]


def worker_variants(cores: int) -> list[Variant]:
    """2, 3 and 4 workers (node 0 among them) over one index node, the cores split between them."""
    return [Variant(f"{workers}-workers", {**CACHES_OFF, **local_topology(workers, 1, 1)},
                    f"{workers} workers, one index node; {max(1, cores // workers)} torch thread(s) each "
                    f"({cores} cores split between them)")
            for workers in (2, 3, 4)]


COMPARISONS: dict[str, Callable[[int], list[Variant]]] = {
    "batching": batching_variants, "threads": thread_variants, "cache": cache_variants,
    "precision": precision_variants, "workers": worker_variants}


@dataclass
class VariantResult:
    variant: Variant
    threads: dict[str, str]  # the thread settings the nodes actually got
    startup_s: float
    stats: RunStats | None = None
    nodes: list[NodeDelta] = field(default_factory=list)
    caches: dict[str, dict[str, float]] = field(default_factory=dict)
    same_as: str = ""  # skipped: its settings equal this earlier variant's
    error: str = ""
    provenance: dict = field(default_factory=dict)  # every node's settings and rag_node_info, as it ran
    warnings: list[str] = field(default_factory=list)

    def ratio_to(self, baseline: "VariantResult") -> float:
        if self.stats is None or baseline.stats is None or not baseline.stats.throughput_rpm:
            return math.nan
        return self.stats.throughput_rpm / baseline.stats.throughput_rpm


def effective_threads(env: Mapping[str, str]) -> dict[str, str]:
    return {v: env.get(v, "0") for v in THREAD_VARS}


def free_port_block(nodes: int = 3) -> int:
    """A port p with p .. p + nodes - 1 free on 127.0.0.1 right now."""
    for _ in range(50):
        base = free_ports(1)[0]
        if base + nodes - 1 <= 65535 and all(_port_free(base + n) for n in range(1, nodes)):
            return base
    raise OSError(f"no block of {nodes} free ports on 127.0.0.1")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def nodes_of(env: Mapping[str, str]) -> int:
    return int(env.get("TOTAL_NODES", 3))


def base_env(env: Mapping[str, str], base_port: int, timeout_s: float, nodes: int = 3) -> dict[str, str]:
    """The caller's environment with the cluster's `nodes` addresses on loopback, the
    service's request deadline just under the clients' timeout (queueing at
    saturation is then measured as latency, not cut into 504s), and, unless
    given, the demo data (`./run.sh demo` builds it)."""
    out = {k: v for k, v in env.items() if not k.startswith("NODE_")}
    out.update({f"NODE_{n}_IP": f"127.0.0.1:{base_port + n}" for n in range(nodes)})
    out["REQUEST_TIMEOUT_S"] = f"{max(1.0, timeout_s - 10):g}"
    out.setdefault("FAISS_INDEX_PATH", str(DEMO_DIR / "faiss_index.bin"))
    out.setdefault("DOCUMENTS_DIR", str(DEMO_DIR / "documents"))
    return out


def run_variant(variant: Variant, env: Mapping[str, str], args: argparse.Namespace, queries: Sequence[str],
                log_dir: Path) -> VariantResult:
    cluster = LocalCluster(env, log_dir)
    started = time.monotonic()
    result = VariantResult(variant, effective_threads(env), math.nan)
    try:
        cluster.start(timeout_s=args.startup_timeout)
        result.startup_s = time.monotonic() - started
        deadline = time.monotonic() + args.max_duration
        url = cluster.url(0)
        nodes = [Node(n, cluster.url(n)) for n in cluster.settings.cluster.nodes]
        metrics_urls = [n.metrics_url for n in nodes]
        if args.warmup:
            warm = LoadTarget(url, queries, args.timeout, deadline)
            run_closed(warm, ClosedGroup("warmup", args.warmup, min(args.warmup, args.concurrency)))
            clear_caches([cluster.url(node) for node in cluster.settings.cluster.workers],
                         cluster.settings.cluster.cluster_token)  # measured hits come from the measured load only
        target = LoadTarget(url, queries, args.timeout, deadline)
        before = scrape_all(metrics_urls)
        check_scraped(nodes, before)
        result.provenance = cluster_record(nodes, before, cluster.settings.cluster.cluster_token)
        result.warnings = settings_warnings(result.provenance)
        if args.compare != "cache":  # there the caches are what is measured
            result.warnings += cache_warnings(nodes, node_settings(result.provenance), queries, args.count)
        records = run_closed(target, ClosedGroup(variant.name, args.count, args.concurrency))
        after = scrape_all(metrics_urls)
        check_scraped(nodes, after)
        result.stats = run_stats(variant.name, args.count, records)
        result.nodes = node_deltas(before, after)
        result.caches = cache_deltas(before, after)
    except (ClusterError, RuntimeError, TimeoutError, requests.RequestException) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        cluster.stop()
    return result


def format_report(results: Sequence[VariantResult]) -> str:
    header = (f"{'variant':<17}{'torch/faiss/http':>17}{'ok/sent':>9}{'req/min':>9}{'p50 s':>8}{'p95 s':>8}"
              f"{'x base':>8}  {'peak RSS MiB n0/n1/..':<22}caches")
    lines = [header, "-" * len(header)]
    baseline = next((r for r in results if r.stats is not None), None)
    for r in results:
        threads = "/".join(r.threads[v] for v in THREAD_VARS)
        if r.same_as or r.error or r.stats is None:
            why = f"same settings as {r.same_as} on this machine: not run again" if r.same_as else r.error
            lines.append(f"{r.variant.name:<17}{threads:>17}  {why}")
            continue
        s = r.stats
        ratio = r.ratio_to(baseline) if baseline is not None else math.nan
        rss = "/".join(mib(n.peak_rss_bytes) for n in r.nodes)
        caches = ", ".join(f"{name} {c.get('hits', 0):.0f} hit {c.get('misses', 0):.0f} miss"
                           + (f" ({c['joined']:.0f} joined)" if c.get("joined") else "")
                           for name, c in r.caches.items() if c.get("hits") or c.get("misses")) or "-"
        errors = "" if not s.errors else "  errors: " + ", ".join(f"{k}={v}" for k, v in s.errors.items())
        lines.append(f"{r.variant.name:<17}{threads:>17}{f'{s.ok}/{s.sent}':>9}{s.throughput_rpm:>9.2f}"
                     f"{s.latency.p50_s:>8.1f}{s.latency.p95_s:>8.1f}{ratio:>7.2f}x  {rss:<22}{caches}{errors}")
    lines.append("")
    for r in results:
        lines.append(f"{r.variant.name}: {r.variant.what}" + (f" (started in {r.startup_s:.1f}s)"
                                                             if not math.isnan(r.startup_s) else ""))
        if r.nodes:
            lines.append(format_nodes_table(r.nodes))
    return "\n".join(lines)


def write_summary(path: Path, args: argparse.Namespace, results: Sequence[VariantResult], extra: dict) -> Path:
    baseline = next((r for r in results if r.stats is not None), None)
    variants = [{**jsonable(r, strict=False), "ratio_to_baseline": r.ratio_to(baseline) if baseline else None}
                for r in results]
    summary = {**extra, "args": vars(args), "variants": variants,
               "warnings": [f"{r.variant.name}: {w}" for r in results for w in r.warnings]}
    return write_json(path, summary)  # NaN kept as NaN (a variant not run has no ratio), as before


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.bench_service", __doc__)
    p.add_argument("--compare", required=True, choices=sorted(COMPARISONS), help="which comparison to run")
    p.add_argument("--variants", default=None,
                   help="comma-separated subset, in this order (the first is the baseline); unset: all")
    p.add_argument("--concurrency", type=int, default=16, help="closed-loop clients")
    p.add_argument("--count", type=int, default=32, help="measured requests per variant")
    p.add_argument("--warmup", type=int, default=2, help="requests before measuring (then the caches are cleared)")
    p.add_argument("--queries-file", help="one query per line; unset: the SPEC's eight")
    p.add_argument("--base-port", type=int, default=8500,
                   help="node n listens on this port + n (0: any free ones)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="clients' per-request timeout (s); the service's REQUEST_TIMEOUT_S is set 10 s below it")
    p.add_argument("--max-duration", type=float, default=1800.0, help="per variant: no request is sent after it (s)")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="per cluster start (s)")
    add_out(p, TOOL)
    p.add_argument("--name", default=None, help="output name; unset: the comparison")
    return p


def choose_variants(compare: str, subset: str | None, cores: int) -> list[Variant]:
    variants = COMPARISONS[compare](cores)
    if not subset:
        return variants
    by_name = {v.name: v for v in variants}
    names = split_list(subset)
    unknown = [n for n in names if n not in by_name]
    if unknown or not names:
        raise ValueError(f"--variants {subset!r}: expected names from {', '.join(by_name)}")
    return [by_name[n] for n in names]


def plan_runs(variants: Sequence[Variant], envs: Sequence[Mapping[str, str]]):
    """(variant, its resolved environment, the earlier variant it equals or '') for each variant:
    two variants that resolve to the same settings on this machine run once."""
    seen: dict[frozenset, str] = {}
    for variant, env in zip(variants, envs):
        key = frozenset(env.items())
        yield variant, env, seen.get(key, "")
        seen.setdefault(key, variant.name)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    for name in ("concurrency", "count", "max_duration", "startup_timeout", "timeout"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.warmup < 0 or not (args.base_port == 0 or 1024 <= args.base_port <= 65533):
        p.error("--warmup must be >= 0 and --base-port 0 or in 1024..65533")
    env = dict(os.environ if env is None else env)
    cores = thread_budget(0)
    try:
        variants = choose_variants(args.compare, args.variants, cores)
        queries = load_queries(args.queries_file)
        most = max(nodes_of({**env, **v.env}) for v in variants)
        base_port = args.base_port or free_port_block(most)
        envs = [pinned_env({**base_env(env, base_port, args.timeout, nodes_of({**env, **v.env})), **v.env}, cores)
                for v in variants]
        for variant_env in envs:
            Settings.from_env(variant_env).require_index_files()
    except (ConfigError, ValueError, OSError) as exc:
        print(f"bench_service: {exc}", file=sys.stderr)
        return 2
    name = args.name or args.compare
    out = run_folder(TOOL, args.out)
    print(f"bench_service: results go to {out}", file=sys.stderr, flush=True)
    results: list[VariantResult] = []
    for variant, variant_env, same_as in plan_runs(variants, envs):
        if same_as:
            results.append(VariantResult(variant, effective_threads(variant_env), math.nan, same_as=same_as))
            continue
        print(f"bench_service: {variant.name}: starting the cluster", file=sys.stderr, flush=True)
        result = run_variant(variant, variant_env, args, queries, out / f"{name}_{variant.name}_logs")
        results.append(result)
        done = result.error or (f"{result.stats.ok}/{result.stats.sent} ok, {result.stats.throughput_rpm:.2f} req/min")
        print(f"bench_service: {variant.name}: {done}", file=sys.stderr, flush=True)
    report = format_report(results)
    path = write_summary(out / f"bench_service_{name}.json", args, results,
                         {"cores": cores, "model_source": envs[0].get("MODEL_SOURCE"),
                          "standin_profile": envs[0].get("STANDIN_PROFILE", ""), "tool": git_commit()})
    print(report)
    for r in results:
        for line in r.warnings:
            print(f"warning: {r.variant.name}: {line}")
    print(f"results in {path}")
    failed = any(r.error or (r.stats is not None and (r.stats.errors or r.stats.ok < args.count)) for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
