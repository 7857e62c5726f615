"""The design-scale index run: build the course's size with embedding-shaped vectors, serve it from an index
node process, measure it; bounded in time.

    python -m profiling.design_scale [--count 4600000] [--dim 768] [--index IVF,Flat --index IVF,SQ8 ...]
        [--nlist 4096] [--nprobe 64] [--queries 1000] [--batches 1,8,32] [--repeat 200]
        [--time-budget 7200] [--work DIR] [--keep] [--out DIR]

Vectors: ``--count`` x ``--dim`` float32 drawn by builders.mixture_vectors (seed 0), streamed: never all in
memory (4.6 M x 768 is 14 GB). Once, before any build: the recall queries (``--queries`` of the vectors plus
noise, builders.recall.sample_queries) and their exact top 10 (a streamed exhaustive search). Then per
``--index`` kind, in order, one at a time:

1. built as ``python -m builders.data build --kind course --vectors mixture --index SPEC`` builds it (IVF-Flat
   streamed to disk by builders.ivf_writer; the other kinds in memory). The first kind serves at ``--nprobe``;
   every later kind is tuned (``--tune``) to the first kind's measured recall (less ``--recall-tolerance``),
   so the compressed kinds are compared at the same recall (the least nprobe on the tuner's doubling ladder,
   1, 2, 4, ..., that reaches it on the build's own recall queries);
2. served by a real index node (``python -m services.node`` as node 2, its index memory-mapped as deployed),
   searched over HTTP (POST /search, services.cluster.IndexClient: node 2's real path);
3. measured: build seconds; bytes on disk; the node's resident memory (anonymous and file-backed: the
   mapped lists it touched) once loaded and after the searches; search latency p50/p99 at each
   ``--batches`` size (``--repeat`` calls each); recall@10 of the node's answers against the exact top 10;
4. removed (unless ``--keep``) before the next kind is built, so the disk holds one kind at a time.

``--time-budget`` seconds bound the run: a kind whose estimated build would not fit in what is left is
skipped (and said so), and each kind's latency loop stops early at its share. Refuses to start when
``--work``'s disk cannot hold the largest kind. Writes design_scale.json under --out.
"""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from builders.data import COURSE_BATCH, build_course, course_vector_batches
from builders.index_kinds import parse_index_spec
from builders.recall import K, RecallOptions, exact_top_k, recall_at, sample_queries
from profiling.lib.cli import comma_list, make_parser, positive
from profiling.lib.index_node import serving_process
from profiling.lib.report import percentiles, run_folder, text_table, write_json

DEFAULT_INDEXES = ("IVF,Flat", "IVF,SQ8")
DESIGN_COUNT, DESIGN_DIM, DESIGN_NLIST = 4_600_000, 768, 4096
# Rough rate of this run's heaviest step per core (float32 multiply-adds a second): every build assigns each
# vector to a list (count x nlist x dim) and its recall check scans all vectors once per query batch.
MACS_PER_CORE_S = 25e9


def index_bytes(spec: str, count: int, dim: int, nlist: int) -> int:
    """What the kind's file holds: its codes and int64 ids, plus the centroids."""
    kind = parse_index_spec(spec, dim)
    code = {"IVF-Flat": 4 * dim, "IVF-SQ8": dim, "HNSW-Flat": 4 * dim + 2 * 32 * 4}.get(kind.family)
    if code is None:  # the PQ kinds keep the full vectors beside their codes, for the exact re-ranking
        code = (kind.m or 0) + 4 * dim
    return count * (code + 8) + nlist * dim * 4


def build_estimate_s(count: int, dim: int, nlist: int, queries: int, cores: int) -> float:
    """Seconds for one build on `cores` busy cores: k-means on 39 points per list (10 rounds), the list
    assignment, the recall check's exhaustive search, and drawing the vectors four times (the writer's two
    passes, the recall check's two)."""
    macs = 10 * 39 * nlist * nlist * dim + count * nlist * dim + count * queries * dim + 4 * count * dim * dim
    return macs / (MACS_PER_CORE_S * cores)


def node_memory(pid: int) -> dict[str, int]:
    """The node's resident bytes: all, anonymous (its heap) and file-backed (the mapped index it touched)."""
    fields = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name = line.split(":", 1)[0]
            if name in fields:
                found[fields[name]] = int(line.split()[1]) * 1024
    return found


def served(url: str, queries: np.ndarray, batches: list[int], repeat: int, until: float) -> dict[str, Any]:
    """Recall-query answers and latency per batch size through the node's POST /search."""
    from services.cluster.clients import IndexClient
    client = IndexClient(url, connect_timeout_s=3, read_timeout_s=300)
    ids = np.concatenate([np.asarray(client.search(queries[i : i + 32], K)[0], dtype=np.int64)
                          for i in range(0, len(queries), 32)])
    latency: dict[str, Any] = {}
    for batch in batches:
        times: list[float] = []
        for i in range(repeat):
            if time.monotonic() > until and len(times) >= 2:
                break
            start = (i * batch) % max(1, len(queries) - batch)
            t0 = time.perf_counter()
            client.search(queries[start : start + batch], K)
            times.append((time.perf_counter() - t0) * 1000)
        p50, p99 = percentiles(times, (50, 99))
        latency[f"b{batch}"] = {"p50_ms": round(p50, 2), "p99_ms": round(p99, 2), "calls": len(times)}
    return {"ids": ids, "latency": latency}


def run_kind(spec: str, position: int, args, work: Path, queries: np.ndarray, exact: np.ndarray,
             target: float | None, until: float) -> dict[str, Any]:
    options = RecallOptions(accept_low=True, queries=args.queries, min_recall=target if target is not None else 0.0,
                            tune=target is not None)
    directory = work / f"v{position}"
    result = build_course(directory, args.count, dim=args.dim, nlist=args.nlist, nprobe=args.nprobe, index=spec,
                          vectors="mixture", force=True, progress=sys.stderr.isatty(), recall=options,
                          batch_size=args.batch_size)
    record = result.manifest.index if result.manifest else {}
    row: dict[str, Any] = {"index": spec, "spec": record.get("spec"), "nprobe": record.get("nprobe"),
                           "ef_search": record.get("ef_search"), "build_s": round(result.seconds, 1),
                           "disk_bytes": result.index_bytes, "documents_bytes": result.db_bytes,
                           "build_recall": (record.get("recall") or {}).get("overall"),
                           "tuned_to": target}
    # Half of what is left for this kind's searches, the rest for the kinds after it.
    share = time.monotonic() + max(30.0, (until - time.monotonic()) / (2 * max(1, len(args.index) - position)))
    with serving_process(result.index_path, work / f"v{position}-index-node.log") as (url, node):
        row["memory_loaded"] = node_memory(node.pid)
        answers = served(url, queries, args.batches, args.repeat, share)
        row["memory_serving"] = node_memory(node.pid)
    row["recall"] = round(recall_at(answers["ids"], exact), 4)
    row["latency"] = answers["latency"]
    if not args.keep:
        shutil.rmtree(directory, ignore_errors=True)
    return row


def _parser():
    parser = make_parser("python -m profiling.design_scale", __doc__.split("\n\n")[0])
    parser.add_argument("--count", type=positive(int), default=DESIGN_COUNT, help="vectors (and documents)")
    parser.add_argument("--dim", type=positive(int), default=DESIGN_DIM)
    parser.add_argument("--index", action="append",
                        help=f"index kinds in order, repeatable; the first sets the recall the rest are tuned to "
                             f"(default: {'; '.join(DEFAULT_INDEXES)})")
    parser.add_argument("--nlist", type=positive(int), default=None, help=f"IVF lists (default: the build's, "
                        f"{DESIGN_NLIST} at the design count)")
    parser.add_argument("--nprobe", type=positive(int), default=64, help="the first kind's nprobe")
    parser.add_argument("--queries", type=positive(int), default=1000, help="recall queries")
    parser.add_argument("--recall-tolerance", type=float, default=0.01,
                        help="the later kinds are tuned to the first kind's recall less this (a quantized kind's "
                             "recall can top out just under the full vectors')")
    parser.add_argument("--batches", type=comma_list(int, minimum=1), default=[1, 8, 32])
    parser.add_argument("--repeat", type=positive(int), default=200, help="timed searches per batch size")
    parser.add_argument("--batch-size", type=positive(int), default=COURSE_BATCH, help="vectors drawn at a time")
    parser.add_argument("--time-budget", type=positive(float), default=7200.0, help="seconds for the whole run")
    parser.add_argument("--cores", type=positive(int), default=2, help="cores assumed by the time estimates")
    parser.add_argument("--work", type=Path, default=None, help="where the versions are built (default: under --out)")
    parser.add_argument("--keep", action="store_true", help="keep each kind's version (default: removed once measured)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a fresh runs/design_scale-<UTC>)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.index = args.index or list(DEFAULT_INDEXES)
    started = time.monotonic()
    until = started + args.time_budget
    out = run_folder("design_scale", args.out)
    work = args.work or out / "versions"
    work.mkdir(parents=True, exist_ok=True)
    from builders.index_kinds import default_nlist
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
    estimate = build_estimate_s(args.count, args.dim, nlist, args.queries, args.cores)
    exact_s = (args.count * args.queries * args.dim + args.count * args.dim * args.dim) / (MACS_PER_CORE_S * args.cores)
    print(f"estimates on {args.cores} cores: exact search ~{exact_s:.0f} s, each build ~{estimate:.0f} s "
          f"(+ documents, disk writes and hashing)", flush=True)
    if time.monotonic() + exact_s + estimate > until:
        print(f"design_scale: --time-budget {args.time_budget:g} s is short of the exact search and one build",
              file=sys.stderr)
        return 2
    vectors = lambda: course_vector_batches(args.count, args.dim, 0, args.batch_size, "mixture")  # noqa: E731
    queries = sample_queries(vectors, args.count, args.queries, seed=1)
    exact = exact_top_k(queries.vectors, vectors)[0][0]
    print(f"exact top {K} of {len(queries.vectors)} queries in {time.monotonic() - started:.0f} s", flush=True)
    rows: list[dict[str, Any]] = []
    target = None
    for position, spec in enumerate(args.index):
        if time.monotonic() + estimate > until:
            rows.append({"index": spec, "skipped": f"its build (~{estimate:.0f} s) would pass --time-budget"})
            print(f"{spec}: skipped, {rows[-1]['skipped']}", flush=True)
            continue
        row = run_kind(spec, position, args, work, queries.vectors, exact, target, until)
        rows.append(row)
        target = max(0.0, row["recall"] - args.recall_tolerance) if target is None else target
        print(f"{spec}: built in {row['build_s']} s, recall@10 {row['recall']} at {row['spec']} "
              f"nprobe {row['nprobe']}", flush=True)
    report = {"count": args.count, "dim": args.dim, "nlist": nlist, "vectors": "mixture (builders.mixture_vectors)",
              "queries": len(queries.vectors), "seconds": round(time.monotonic() - started, 1), "rows": rows}
    write_json(out / "design_scale.json", report)
    print(format_rows(rows, args.batches))
    print(f"wrote {out / 'design_scale.json'}")
    return 0


def format_rows(rows: list[dict[str, Any]], batches: list[int]) -> str:
    done = [r for r in rows if "skipped" not in r]
    columns = [("kind", "<18"), ("nprobe", ">7"), ("recall@10", ">10.4f"), ("build s", ">9.1f"), ("disk GB", ">8.2f"),
               ("RSS GB load/serve (anon)", ">27"), *[(f"p50/p99 b{b} ms", ">17") for b in batches]]
    table = text_table(columns, [
        (r["spec"], str(r["nprobe"]), r["recall"], r["build_s"], r["disk_bytes"] / 1e9,
         f"{r['memory_loaded'].get('rss', 0) / 1e9:.2f}/{r['memory_serving'].get('rss', 0) / 1e9:.2f} "
         f"({r['memory_serving'].get('anon', 0) / 1e9:.2f})",
         *[f"{r['latency'][f'b{b}']['p50_ms']:.2f}/{r['latency'][f'b{b}']['p99_ms']:.2f}" for b in batches])
        for r in done])
    return table + "".join(f"\n{r['index']}: skipped: {r['skipped']}" for r in rows if "skipped" in r)


if __name__ == "__main__":
    sys.exit(main())
