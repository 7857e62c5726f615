"""The design-scale index run: build the course's size with embedding-shaped vectors, serve it from an index
node process, sweep its nprobe to the recall floor, tune the compressed kinds to the same recall, measure
each; bounded in time.

    python -m profiling.design_scale [--count 4600000] [--dim 768] [--index IVF,Flat --index IVF,SQ8 ...]
        [--nlist 4096] [--nprobe 64,128,256] [--min-recall F] [--queries 1000] [--batches 1,8,32]
        [--repeat 100] [--build-queries 100] [--time-budget 2100] [--work DIR] [--keep] [--out DIR]

Vectors: ``--count`` x ``--dim`` float32 drawn by builders.mixture_vectors (seed 0), streamed: never all in
memory (4.6 M x 768 is 14 GB). Once, before any build: the recall queries (``--queries`` of the vectors plus
noise, builders.recall.sample_queries) and their exact top 10 (a streamed exhaustive search); two passes
over the vectors. Then per ``--index`` kind (IVF kinds: nprobe is what is swept), in order, one at a time:

1. built by builders.data's build_course (``--vectors mixture``; IVF-Flat streamed to disk by
   builders.ivf_writer, the other kinds in memory), as a course build trains and fills it: k-means on 39
   vectors a list (faiss's least; 160 k at nlist 4,096), faiss's 10 rounds, then every vector assigned to
   its list. The build's own recall check runs on ``--build-queries`` queries only and is accepted whatever
   it finds (recorded as ``build_recall``): this run measures recall itself, through the node, on
   ``--queries``; the check's two passes over the vectors (its queries, its exact search) remain.
2. served by a real index node (``python -m services.node`` as node 2, its index memory-mapped as deployed)
   at one nprobe at a time: the node started with ``NPROBE`` set (the setting it serves with; its /health
   says what it took), searched over HTTP (POST /search, services.cluster.IndexClient: node 2's real path).
   The first kind at every ``--nprobe`` (the sweep). Each later kind on a ladder that starts at the least
   swept nprobe whose recall met the floor (``--min-recall``, default INDEX_MIN_RECALL) and doubles up to
   nlist, stopped at the first rung that meets it; when no swept nprobe met the floor, the target is the
   best swept recall less ``--recall-tolerance``, from the least swept nprobe meeting that. So the kinds are
   compared at the same recall. No rung below the start is tried: with the same lists (a course build's
   kinds train the same coarse quantizer: the same sample, faiss's same seeded k-means), quantized codes
   can only lose neighbours the full vectors find in them.
3. measured at every swept nprobe and at a later kind's last rung: recall@10 of the node's answers against
   the exact top 10; latency p50/p99 at each ``--batches`` size (``--repeat`` calls each, cut short at the
   point's share of the budget); the node's resident memory (anonymous and file-backed: the mapped lists it
   touched) once loaded and after the searches; and the kind's build seconds and bytes on disk. The lower
   rungs: recall only.
4. removed (unless ``--keep``) before the next kind is built, so the disk holds one kind at a time.

``--time-budget`` seconds bound the run (the default, 35 min, holds the design size's exact search, two builds
and their serving on 2 quiet cores by build_estimate_s and exact_estimate_s, ~23 min of it before serving): a
kind whose estimated build would not fit in what is left is skipped (and said so), and each point's latency
loop stops at its share of what is left once the later kinds' builds are set aside, so the latency loops take
what the builds leave. Refuses to start when ``--work``'s
disk cannot hold the largest kind, or the budget is short of the exact search and one build. Writes
design_scale.json and design_scale.png (recall against p50 latency per batch size, bytes on disk and
resident per kind) under --out.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builders.data import COURSE_BATCH, build_course, course_vector_batches
from builders.index_kinds import default_nlist, parse_index_spec
from builders.recall import K, RecallOptions, exact_top_k, recall_at, recall_floor, sample_queries
from profiling.lib.cli import comma_list, make_parser, positive
from profiling.lib.index_node import node_memory, search_latencies_ms, served_nprobe, serving_process
from profiling.lib.report import percentiles, run_folder, text_table, write_json

DEFAULT_INDEXES = ("IVF,Flat", "IVF,SQ8")
DEFAULT_NPROBES = [64, 128, 256]
DESIGN_COUNT, DESIGN_DIM, DESIGN_NLIST = 4_600_000, 768, 4096
# Rough rate of this run's heavy steps per core (float32 multiply-adds a second): k-means, assigning each vector
# to a list (count x nlist x dim), the exhaustive searches, and drawing each vector (a dim x dim rotation).
MACS_PER_CORE_S = 25e9
KMEANS_ROUNDS, POINTS_PER_LIST = 10, 39  # faiss IndexIVF's training: its cp.niter, and the build's sample
BUILD_PASSES = 4  # IVF-Flat's draws of all vectors: assign, write, the recall check's queries and exact search
MIN_LATENCY_S = 10.0  # the least a point's latency loop is given, whatever the budget


def index_bytes(spec: str, count: int, dim: int, nlist: int) -> int:
    """What the kind's file holds: its codes and int64 ids, plus the centroids."""
    kind = parse_index_spec(spec, dim)
    code = {"IVF-Flat": 4 * dim, "IVF-SQ8": dim, "HNSW-Flat": 4 * dim + 2 * 32 * 4}.get(kind.family)
    if code is None:  # the PQ kinds keep the full vectors beside their codes, for the exact re-ranking
        code = (kind.m or 0) + 4 * dim
    return count * (code + 8) + nlist * dim * 4


def exact_estimate_s(count: int, dim: int, queries: int, cores: int) -> float:
    """Seconds for the recall queries and their exact top 10: two draws of every vector, one exhaustive search."""
    return (2 * count * dim * dim + count * queries * dim) / (MACS_PER_CORE_S * cores)


def build_estimate_s(count: int, dim: int, nlist: int, build_queries: int, cores: int) -> float:
    """Seconds for one build on `cores` busy cores: k-means (39 points a list, 10 rounds), the list assignment,
    the recall check's exhaustive search of its few queries, and drawing the vectors BUILD_PASSES times."""
    macs = (KMEANS_ROUNDS * POINTS_PER_LIST * nlist * nlist * dim + count * nlist * dim + count * build_queries * dim
            + BUILD_PASSES * count * dim * dim)
    return macs / (MACS_PER_CORE_S * cores)


@dataclass(frozen=True)
class Target:
    """What the first kind's sweep found: the recall the later kinds are tuned to, the nprobe their ladder
    starts at, and the least swept nprobe that met the floor (None: none did)."""
    recall: float
    start: int
    reached_at: int | None


def tuning_target(swept: list[dict[str, Any]], floor: float, tolerance: float) -> Target:
    """The floor where a swept nprobe met it, else the best swept recall less `tolerance`; the ladder starts at
    the least swept nprobe meeting that target (below it the full vectors miss it, and codes do no better)."""
    reached = [r["nprobe"] for r in swept if r["recall"] >= floor]
    recall = floor if reached else max(0.0, max(r["recall"] for r in swept) - tolerance)
    start = min(r["nprobe"] for r in swept if r["recall"] >= recall)
    return Target(recall, start, min(reached) if reached else None)


def ladder(start: int, nlist: int) -> list[int]:
    """start, doubled up to nlist (nlist itself the last rung)."""
    return sorted({min(start * 2 ** i, nlist) for i in range(max(1, nlist.bit_length() + 1))})


def latency(client, queries: np.ndarray, batches: list[int], repeat: int, until: float) -> dict[str, Any]:
    """p50/p99 per batch size through the node's POST /search; each size stops at its share of the time left."""
    found: dict[str, Any] = {}
    for position, batch in enumerate(batches):
        deadline = time.monotonic() + (until - time.monotonic()) / (len(batches) - position)
        times = search_latencies_ms(lambda q: client.search(q, K), queries, batch, repeat, deadline)
        p50, p99 = percentiles(times, (50, 99))
        found[f"b{batch}"] = {"p50_ms": round(p50, 2), "p99_ms": round(p99, 2), "calls": len(times)}
    return found


def serve_point(index_path: Path, log: Path, nprobe: int, queries: np.ndarray, exact: np.ndarray, args,
                timed_from: float, share_s: float) -> dict[str, Any]:
    """One node started at `nprobe`: its recall@10, and its latency (`share_s` seconds at most, past the
    least calls) when that recall is at least `timed_from`."""
    from services.cluster.clients import IndexClient
    with serving_process(index_path, log, {**os.environ, "NPROBE": str(nprobe)}) as (url, node):
        point: dict[str, Any] = {"nprobe": served_nprobe(url), "memory_loaded": node_memory(node.pid)}
        if point["nprobe"] != nprobe:
            raise RuntimeError(f"the node serves nprobe {point['nprobe']}, not the {nprobe} asked; its log: {log}")
        client = IndexClient(url, connect_timeout_s=3, read_timeout_s=600)
        ids = np.concatenate([np.asarray(client.search(queries[i : i + 32], K)[0], dtype=np.int64)
                              for i in range(0, len(queries), 32)])
        point["recall"] = round(recall_at(ids, exact), 4)
        if point["recall"] >= timed_from:
            point["latency"] = latency(client, queries, args.batches, args.repeat, time.monotonic() + share_s)
        point["memory_serving"] = node_memory(node.pid)
    return point


def run_kind(spec: str, position: int, args, work: Path, queries: np.ndarray, exact: np.ndarray,
             target: Target | None, until: float) -> list[dict[str, Any]]:
    """The kind built, then served at each nprobe of the sweep (`target` None: the first kind) or of its
    ladder; its measured rows."""
    directory = work / f"v{position}"
    first_nprobe = min(args.nprobe) if target is None else target.start
    result = build_course(directory, args.count, dim=args.dim, nlist=args.nlist, nprobe=first_nprobe, index=spec,
                          vectors="mixture", force=True, progress=sys.stderr.isatty(), batch_size=args.batch_size,
                          recall=RecallOptions(accept_low=True, min_recall=0.0, queries=args.build_queries))
    record = result.manifest.index if result.manifest else {}
    built = {"index": spec, "spec": record.get("spec"), "build_s": round(result.seconds, 1),
             "disk_bytes": result.index_bytes, "documents_bytes": result.db_bytes,
             "build_recall": (record.get("recall") or {}).get("overall"), "build_recall_queries": args.build_queries,
             "build_nprobe": record.get("nprobe")}
    print(f"{spec}: built {built['spec']} in {built['build_s']} s", flush=True)
    nlist = result.nlist
    nprobes = sorted({min(p, nlist) for p in args.nprobe}) if target is None else ladder(target.start, nlist)
    later_builds = (len(args.index) - position - 1) * args.build_estimate_s
    rows: list[dict[str, Any]] = []
    rungs: list[dict[str, Any]] = []
    for i, nprobe in enumerate(nprobes):
        # Each timed point left (this kind's, one per later kind): its latency loops get half of an equal share
        # of the time left past the later builds; the other half is for its node start and recall searches.
        points_left = (len(nprobes) - i if target is None else 1) + len(args.index) - position - 1
        share = max(MIN_LATENCY_S, (until - time.monotonic() - later_builds) / (2 * points_left))
        last = i == len(nprobes) - 1
        timed_from = 0.0 if target is None or last else target.recall
        point = serve_point(result.index_path, work / f"v{position}-index-node.log", nprobe, queries, exact, args,
                            timed_from, share)
        print(f"{built['spec']} nprobe {nprobe}: recall@10 {point['recall']}", flush=True)
        if target is None:
            rows.append({**built, "role": "sweep", **point})
            continue
        rungs.append({"nprobe": nprobe, "recall": point["recall"]})
        if "latency" in point:
            rows.append({**built, "role": "tuned", "tuned_to": round(target.recall, 4), "ladder": rungs, **point})
            break
    if not args.keep:
        shutil.rmtree(directory, ignore_errors=True)
    return rows


def _parser():
    parser = make_parser("python -m profiling.design_scale", __doc__.split("\n\n")[0])
    parser.add_argument("--count", type=positive(int), default=DESIGN_COUNT, help="vectors (and documents)")
    parser.add_argument("--dim", type=positive(int), default=DESIGN_DIM)
    parser.add_argument("--index", action="append",
                        help=f"IVF index kinds in order, repeatable; the first is swept, the rest tuned to the recall "
                             f"it reached (default: {'; '.join(DEFAULT_INDEXES)})")
    parser.add_argument("--nlist", type=positive(int), default=None, help=f"IVF lists (default: the build's, "
                        f"{DESIGN_NLIST} at the design count)")
    parser.add_argument("--nprobe", type=comma_list(int, minimum=1, sort_unique=True), default=DEFAULT_NPROBES,
                        help="the first kind's nprobe values, each served by a node started at it")
    parser.add_argument("--min-recall", type=float, default=None,
                        help="the recall floor the sweep looks for and the later kinds are tuned to "
                             "(default: INDEX_MIN_RECALL)")
    parser.add_argument("--queries", type=positive(int), default=1000, help="recall queries")
    parser.add_argument("--recall-tolerance", type=float, default=0.01,
                        help="when no swept nprobe meets the floor, the later kinds are tuned to the best swept "
                             "recall less this (a quantized kind's recall can top out just under the full vectors')")
    parser.add_argument("--batches", type=comma_list(int, minimum=1), default=[1, 8, 32])
    parser.add_argument("--repeat", type=positive(int), default=100, help="timed searches per batch size, at most")
    parser.add_argument("--build-queries", type=positive(int), default=100,
                        help="queries of each build's own recall check (recorded, not used)")
    parser.add_argument("--batch-size", type=positive(int), default=COURSE_BATCH, help="vectors drawn at a time")
    parser.add_argument("--time-budget", type=positive(float), default=2100.0, help="seconds for the whole run")
    parser.add_argument("--cores", type=positive(int), default=2, help="cores assumed by the time estimates")
    parser.add_argument("--work", type=Path, default=None, help="where the versions are built (default: under --out)")
    parser.add_argument("--keep", action="store_true", help="keep each kind's version (default: removed once measured)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a fresh runs/design_scale-<UTC>)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.index = args.index or list(DEFAULT_INDEXES)
    not_ivf = [spec for spec in args.index if not parse_index_spec(spec, args.dim).is_ivf]
    if not_ivf:
        parser.error(f"--index {not_ivf[0]}: the sweep and the ladder set nprobe, an IVF kind's")
    floor = recall_floor(args.min_recall)
    started = time.monotonic()
    until = started + args.time_budget
    out = run_folder("design_scale", args.out)
    work = args.work or out / "versions"
    work.mkdir(parents=True, exist_ok=True)
    nlist = args.nlist or default_nlist(args.count)
    sizes = {spec: index_bytes(spec, args.count, args.dim, nlist) for spec in args.index}
    needed = (max(sizes.values()) if not args.keep else sum(sizes.values())) + 120 * args.count
    free = shutil.disk_usage(work).free
    print(f"plan: {args.count:,} x {args.dim} mixture vectors ({args.count * args.dim * 4 / 1e9:.1f} GB as float32), "
          f"nlist {nlist}; on disk " + ", ".join(f"{s} {b / 1e9:.1f} GB" for s, b in sizes.items())
          + f" (+ documents ~{120 * args.count / 1e9:.1f} GB); {free / 1e9:.1f} GB free in {work}", flush=True)
    if free < needed:
        print(f"design_scale: {work} has {free / 1e9:.1f} GB free, the run needs {needed / 1e9:.1f} GB", file=sys.stderr)
        return 2
    args.build_estimate_s = build_estimate_s(args.count, args.dim, nlist, args.build_queries, args.cores)
    exact_s = exact_estimate_s(args.count, args.dim, args.queries, args.cores)
    print(f"estimates on {args.cores} cores: exact search ~{exact_s:.0f} s, each build ~{args.build_estimate_s:.0f} s "
          f"(+ documents, disk writes and hashing); floor {floor:g}, first kind swept at nprobe "
          f"{','.join(map(str, args.nprobe))}", flush=True)
    if time.monotonic() + exact_s + args.build_estimate_s > until:
        print(f"design_scale: --time-budget {args.time_budget:g} s is short of the exact search and one build",
              file=sys.stderr)
        return 2
    vectors = lambda: course_vector_batches(args.count, args.dim, 0, args.batch_size, "mixture")  # noqa: E731
    queries = sample_queries(vectors, args.count, args.queries, seed=1)
    exact = exact_top_k(queries.vectors, vectors)[0][0]
    print(f"exact top {K} of {len(queries.vectors)} queries in {time.monotonic() - started:.0f} s", flush=True)
    rows: list[dict[str, Any]] = []
    target: Target | None = None
    for position, spec in enumerate(args.index):
        if time.monotonic() + args.build_estimate_s > until:
            rows.append({"index": spec, "skipped": f"its build (~{args.build_estimate_s:.0f} s) would pass --time-budget"})
            print(f"{spec}: skipped, {rows[-1]['skipped']}", flush=True)
            continue
        measured = run_kind(spec, position, args, work, queries.vectors, exact, target, until)
        rows += measured
        if target is None:
            target = tuning_target(measured, floor, args.recall_tolerance)
            print(f"{spec}: floor {floor:g} " + (f"met from nprobe {target.reached_at}" if target.reached_at else
                  f"not met; the later kinds tuned to {target.recall:.4f}"), flush=True)
    report = {"count": args.count, "dim": args.dim, "nlist": nlist, "vectors": "mixture (builders.mixture_vectors)",
              "queries": len(queries.vectors), "floor": floor, "swept_nprobe": args.nprobe,
              "floor_reached_at_nprobe": target.reached_at if target else None,
              "tuned_to": round(target.recall, 4) if target else None,
              "seconds": round(time.monotonic() - started, 1), "rows": rows}
    write_json(out / "design_scale.json", report)
    from profiling.lib.plots import design_scale_plot
    measured_rows = [r for r in rows if "latency" in r]
    if measured_rows:
        design_scale_plot(out / "design_scale.png", measured_rows, floor)
    print(format_rows(rows, args.batches))
    print(f"wrote {out / 'design_scale.json'}" + (f" and {out / 'design_scale.png'}" if measured_rows else ""))
    return 0


def format_rows(rows: list[dict[str, Any]], batches: list[int]) -> str:
    done = [r for r in rows if "skipped" not in r]
    columns = [("kind", "<18"), ("role", "<7"), ("nprobe", ">7"), ("recall@10", ">10.4f"), ("build s", ">9.1f"),
               ("disk GB", ">8.2f"), ("RSS GB load/serve (anon)", ">27"), *[(f"p50/p99 b{b} ms", ">17") for b in batches]]
    table = text_table(columns, [
        (r["spec"], r["role"], str(r["nprobe"]), r["recall"], r["build_s"], r["disk_bytes"] / 1e9,
         f"{r['memory_loaded'].get('rss', 0) / 1e9:.2f}/{r['memory_serving'].get('rss', 0) / 1e9:.2f} "
         f"({r['memory_serving'].get('anon', 0) / 1e9:.2f})",
         *[f"{r['latency'][f'b{b}']['p50_ms']:.2f}/{r['latency'][f'b{b}']['p99_ms']:.2f}" for b in batches])
        for r in done])
    ladders = "".join(f"\n{r['spec']} tuned to {r['tuned_to']}: " + ", ".join(
        f"nprobe {rung['nprobe']} {rung['recall']}" for rung in r["ladder"]) for r in done if r["role"] == "tuned")
    return table + ladders + "".join(f"\n{r['index']}: skipped: {r['skipped']}" for r in rows if "skipped" in r)


if __name__ == "__main__":
    sys.exit(main())
