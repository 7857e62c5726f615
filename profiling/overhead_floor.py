"""The service's own overhead: a 3-node cluster on 127.0.0.1 with null models (MODEL_SOURCE=null: every
model stage a stand-in of fixed, near-zero cost, pipeline/null_models.py), driven by closed loops of
1, 8, 32 and 128 clients.

Per level: requests a minute, latency p50/p95/p99, and the time per request in each component of the
service (profiling/lib/floor_breakdown.py: the HTTP hop to node 0, node 0's edge and routing, the relay
to node 1, each stage's queue wait, batch run and handoff, the index call), read from the nodes'
completion lines and /metrics. Each request asks a query of its own (no cache answers any part of it).
Every level is bounded in requests (--requests-per-client, at least --min-requests) and in time
(--level-s). The data is a course build (random vectors, --docs documents), built into --out first.

--compare REV runs the same on commit REV (a commit with MODEL_SOURCE=null), checked out into a
temporary folder (git archive), right after this checkout's run: both in one table. Writes overhead_floor.json
into --out (default: a fresh runs/overhead_floor-<UTC time>/).
"""
from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from pipeline import spec
from pipeline.config import Settings
from profiling.lib import local_cluster
from profiling.lib.cli import add_out, comma_list, make_parser, positive
from profiling.lib.floor_breakdown import breakdown, parse_completions, unlogged
from profiling.lib.load import ClosedGroup, LoadTarget, run_closed
from profiling.lib.prometheus import Node, scrape_nodes
from profiling.lib.provenance import REPO_ROOT
from profiling.lib.report import run_folder, run_stats
from profiling.lib.revisions import checkout, write_compared

TOOL = "overhead_floor"
STARTUP_S = 300.0


def parser():
    p = make_parser("python -m profiling.overhead_floor", __doc__)
    p.add_argument("--clients", type=comma_list(int, minimum=1), default=[1, 8, 32, 128], help="closed-loop levels")
    p.add_argument("--requests-per-client", type=positive(int), default=4, help="requests per level = this x clients")
    p.add_argument("--min-requests", type=positive(int), default=16, help="requests per level at least")
    p.add_argument("--level-s", type=positive(float), default=120.0, help="no new request after this long per level")
    p.add_argument("--timeout", type=positive(float), default=120.0, help="per-request timeout (s)")
    p.add_argument("--docs", type=positive(int), default=2000, help="documents in the course build")
    p.add_argument("--compare", default="", metavar="REV", help="a commit measured right after this checkout")
    p.add_argument("--quick", action="store_true", help="a check that the tool works: 1 and 4 clients, 4 requests")
    add_out(p, TOOL)
    return p


def queries(n: int) -> list[str]:
    """n distinct queries (the reference's, numbered): no embedding or reply cache answers any."""
    return [f"{spec.REFERENCE_QUERIES[i % len(spec.REFERENCE_QUERIES)]} (case {i})" for i in range(n)]


def build_data(out: Path, docs: int, log) -> dict[str, str]:
    """A course build (random vectors: null mode's embedder searches it) into out/data; its settings."""
    data = out / "data"
    subprocess.run([sys.executable, "-m", "builders.data", "build", "--out", str(data), "--kind", "course",
                    "--docs", str(docs), "--force", "--no-progress"], cwd=REPO_ROOT, stdout=log,
                   stderr=subprocess.STDOUT, check=True)
    return {"FAISS_INDEX_PATH": str(data / "faiss_index.bin"), "DOCUMENTS_DIR": str(data / "documents")}


@contextlib.contextmanager
def null_cluster(tree: Path, env: dict[str, str], log_dir: Path, log):
    """The three nodes of `tree` (its own code: cwd and PYTHONPATH) in null mode; yields node 0's URL."""
    ports = local_cluster.free_ports(3)
    env = {**env, "PYTHONPATH": str(tree), **{f"NODE_{n}_IP": f"127.0.0.1:{p}" for n, p in enumerate(ports)}}
    process = subprocess.Popen([sys.executable, "-m", local_cluster.LAUNCHER, "--log-dir", str(log_dir)], cwd=tree,
                               env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{ports[0]}"
    try:
        health = local_cluster.wait_ready(url, process, STARTUP_S, f"{log.name} and {log_dir}")
        yield url, [Node(n, f"http://127.0.0.1:{p}") for n, p in enumerate(ports)], health
    finally:
        local_cluster.stop(process)


def read_completions(logs: list[Path], offsets: list[int]) -> list[list]:
    lines = []
    for path, offset in zip(logs, offsets):
        with open(path, "rb") as f:
            f.seek(offset)
            lines.append(parse_completions(f.read().decode("utf-8", "replace")))
    return lines


def logged_completions(logs: list[Path], offsets: list[int], answered: set[str], wait_s: float = 10.0) -> list[list]:
    """Node 0's and node 1's completion lines since `offsets`, once every answered request has its own
    (or after `wait_s`)."""
    until = time.monotonic() + wait_s
    while True:
        lines = read_completions(logs, offsets)
        missing = unlogged(answered, *lines)
        if not missing or time.monotonic() >= until:
            if missing:
                print(f"[{TOOL}] {len(missing)} answered requests have no completion line after {wait_s:.0f}s "
                      f"(e.g. {missing[0]}): the breakdown leaves them out", flush=True)
            return lines
        time.sleep(0.05)


def run_level(url: str, nodes: list[Node], log_dir: Path, clients: int, args, asked: list[str]) -> dict:
    count = max(args.min_requests, clients * args.requests_per_client)
    logs = [log_dir / f"node{n}.log" for n in (0, 1)]
    offsets = [path.stat().st_size for path in logs]
    before = scrape_nodes(nodes)
    client_cpu = time.process_time()  # this process: the load's clients
    target = LoadTarget(url, asked, args.timeout, time.monotonic() + args.level_s + args.timeout,
                        id_prefix=f"floor{clients}")
    records = run_closed(target, ClosedGroup(f"c{clients}", count, clients, args.level_s))
    client_cpu = time.process_time() - client_cpu
    lines = logged_completions(logs, offsets, {r.request_id for r in records if r.ok})
    after = scrape_nodes(nodes)
    stats = run_stats(f"c{clients}", count, records)
    client_ms = {r.request_id: r.latency_s * 1000 for r in records if r.ok}
    return {"clients": clients, "sent": stats.sent, "ok": stats.ok, "errors": stats.errors,
            "requests_per_minute": stats.throughput_rpm,
            "latency_ms": {"p50": stats.latency.p50_s * 1000, "p95": stats.latency.p95_s * 1000,
                           "p99": stats.latency.p99_s * 1000},
            "components_ms": {**breakdown(client_ms, lines[0], lines[1], before, after),
                              # per answered request, as the nodes' figures in breakdown
                              "load generator: CPU ms per request":
                                  1000 * client_cpu / len(client_ms) if client_ms else math.nan}}


def run_tree(tree: Path, args, out: Path, data_env: dict[str, str], log) -> dict:
    """Every level on `tree`'s cluster, and what its node 0 says it runs (/health: model source, devices)."""
    # The stand-ins' tokenizers from this checkout's stand-in folder, whichever tree runs.
    standins = str(Settings.from_env().standin_dir)
    env = {**os.environ, **data_env, "MODEL_SOURCE": "null", "HF_HUB_OFFLINE": "1", "LOG_LEVEL": "info",
           "LOG_FORMAT": "text", "STANDIN_HOME": standins,
           # 128 clients in flight at once: admitted, none refused for the gateway's bound.
           "GATEWAY_MAX_IN_FLIGHT": str(max(96, 2 * max(args.clients)))}
    log_dir = out / "nodes"
    counts = [max(args.min_requests, c * args.requests_per_client) for c in args.clients]
    asked = queries(sum(counts))
    levels = []
    with null_cluster(tree, env, log_dir, log) as (url, nodes, health):
        for n, (clients, count) in enumerate(zip(args.clients, counts)):
            print(f"[{TOOL}] {clients} clients", flush=True)
            # Each level its own queries: one level's would hit the embedding cache the one before filled.
            first = sum(counts[:n])
            levels.append(run_level(url, nodes, log_dir, clients, args, asked[first:first + count]))
    return {"model_source": health.get("model_source"), "device": health.get("device"), "levels": levels}


def print_table(results: dict[str, dict]) -> None:
    labels = list(results)
    heads = [f"{label[:10]} c{level['clients']}" for label in labels for level in results[label]["levels"]]
    columns = [level for label in labels for level in results[label]["levels"]]
    width = max(len(h) for h in heads) + 2
    print(f"{'':52}" + "".join(h.rjust(width) for h in heads))
    print(f"{'requests a minute':52}" + "".join(f"{c['requests_per_minute']:{width}.1f}" for c in columns))
    for p in ("p50", "p95", "p99"):
        print(f"{'latency ' + p + ' ms':52}" + "".join(f"{c['latency_ms'][p]:{width}.1f}" for c in columns))
    for name in columns[0]["components_ms"]:
        print(f"{name[:52]:52}" + "".join(f"{c['components_ms'].get(name, float('nan')):{width}.2f}" for c in columns))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.clients, args.requests_per_client, args.min_requests, args.level_s = [1, 4], 1, 4, 30.0
    out = run_folder(TOOL, args.out)
    results: dict[str, dict] = {}
    with open(out / "cluster.log", "w") as log, contextlib.ExitStack() as stack:
        try:
            data_env = build_data(out, args.docs, log)
            trees = {"here": REPO_ROOT}
            if args.compare:
                trees[args.compare] = stack.enter_context(checkout(args.compare))
            for label, tree in trees.items():
                results[label] = run_tree(tree, args, out / label.replace("/", "_"), data_env, log)
        except (RuntimeError, TimeoutError, ValueError, subprocess.CalledProcessError) as exc:
            print(f"{TOOL}: {exc} (logs in {out})", file=sys.stderr)
            return 1
    print_table(results)
    print(f"results in {write_compared(out, TOOL, args, results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
