"""Index kinds compared: recall@10, search latency, memory and build time, per kind and parameters.

    python -m profiling.index_bench [--docs 200000] [--vectors uniform|mixture] [--dim 768] [--index SPEC ...] [--nprobe 16,64,256]
        [--ef-search 32,64,128] [--batches 1,8,32] [--repeat 30] [--queries 500] [--out DIR] [--auto]

Each ``--index`` kind is built as ``builders.data build --kind course --docs N --vectors V --index SPEC``
builds it (its recall floor accepted: every figure is reported; ``--vectors mixture`` draws vectors shaped
like real embeddings, builders.mixture_vectors, where uniform ones make every IVF kind look bad), then served as the index node serves it: the
files memory-mapped by :class:`pipeline.vector_index.VectorIndex` behind the node's own search service
(:class:`services.roles.index.search.IndexService`, its batcher). For each nprobe (IVF) or efSearch
(HNSW): recall@10 against an exact search (builders.recall, the same queries for every kind), search
latency p50/p99 at each batch size (``--repeat`` calls), the bytes on disk and the growth of this
process's resident memory while serving it, and the build time. ``--auto`` also builds what
``--index auto`` picks (builders.auto_index) and prints its candidates. Writes ``index_bench.json``
and ``index_bench.png`` under ``--out``.
"""
from __future__ import annotations

import json
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

from builders.data import build_course, course_vector_batches
from builders.mixture_vectors import VECTOR_SOURCES
from builders.recall import RecallOptions, exact_top_k, open_shards, sample_queries, served_recall
from pipeline.spec import EMBED_DIM
from profiling.lib.cli import add_out, comma_list, make_parser
from profiling.lib.plots import index_bench_plot
from profiling.lib.report import percentiles, run_folder, text_table
from services.roles.index.search import IndexService

DEFAULT_INDEXES = ("IVF,Flat", "IVF,SQ8", "IVF,PQ96", "OPQ96,IVF,PQ96", "HNSW32,Flat")


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def latency_ms(service: IndexService, queries: np.ndarray, batch: int, repeat: int) -> tuple[float, float]:
    times = []
    for i in range(repeat):
        start = (i * batch) % max(1, len(queries) - batch)
        t0 = time.perf_counter()
        service.search(queries[start : start + batch], 10, 60.0)
        times.append((time.perf_counter() - t0) * 1000)
    p50, p99 = percentiles(times, (50, 99))
    return p50, p99


def bench_kind(spec: str, args, out: Path, queries, exact) -> list[dict]:
    before = resident_bytes()
    result = build_course(out / f"build-{len(list(out.glob('build-*')))}", args.docs, index=spec, progress=False,
                          force=True, recall=RecallOptions(accept_low=True, queries=args.queries),
                          vectors=args.vectors, dim=args.dim)
    index = open_shards(result.index_files)[0]
    service = IndexService(index, max_size=max(args.batches), max_wait_ms=1.0, max_queue=4 * max(args.batches))
    name, values = ("nprobe", args.nprobe) if index.nlist is not None else ("ef_search", args.ef_search)
    rows = []
    try:
        for value in values:
            setattr(index, name, value)
            recall = served_recall([index], queries, exact).overall
            row = {"spec": result.manifest.index["spec"], "nlist": index.nlist, name: getattr(index, name),
                   "recall": round(recall, 4), "build_s": round(result.seconds, 1),
                   "disk_mb": round(result.index_bytes / 1e6, 1)}
            for batch in args.batches:
                row[f"p50_ms_b{batch}"], row[f"p99_ms_b{batch}"] = latency_ms(service, queries.vectors, batch,
                                                                              args.repeat)
            row["resident_mb"] = round((resident_bytes() - before) / 1e6, 1)
            rows.append(row)
    finally:
        service.close(5.0)
    return rows


def _parser():
    parser = make_parser("python -m profiling.index_bench", __doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=200_000, help="course documents (vectors) to build")
    parser.add_argument("--vectors", choices=VECTOR_SOURCES, default="uniform",
                        help="uniform in the cube (the course's) or mixture (drawn like real embeddings)")
    parser.add_argument("--dim", type=int, default=EMBED_DIM, help="vector width")
    parser.add_argument("--index", action="append", help=f"index kinds (repeatable; default {', '.join(DEFAULT_INDEXES)})")
    parser.add_argument("--nprobe", type=comma_list(int, minimum=1), default=[16, 64, 256])
    parser.add_argument("--ef-search", type=comma_list(int, minimum=1), default=[32, 64, 128])
    parser.add_argument("--batches", type=comma_list(int, minimum=1), default=[1, 8, 32])
    parser.add_argument("--repeat", type=int, default=30, help="searches timed per batch size")
    parser.add_argument("--queries", type=int, default=500, help="recall queries")
    parser.add_argument("--min-recall", type=float, default=0.95, help="--auto's recall floor")
    parser.add_argument("--latency-budget-ms", type=float, default=50.0, help="--auto's budget (batch of 32)")
    parser.add_argument("--auto", action="store_true", help="also build what --index auto picks")
    add_out(parser, "index_bench")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = run_folder("index_bench", args.out)
    vectors = partial(course_vector_batches, args.docs, args.dim, 0, source=args.vectors)
    queries = sample_queries(vectors, args.docs, args.queries, seed=0)
    exact = exact_top_k(queries.vectors, vectors)
    rows = [row for spec in args.index or DEFAULT_INDEXES for row in bench_kind(spec, args, out, queries, exact)]
    columns = [("kind", "<22"), ("nlist", ">6"), ("nprobe", ">7"), ("efS", ">5"), ("recall", ">8.4f"),
               *[(f"p50/p99 b{b} ms", ">18") for b in args.batches], ("disk MB", ">9.1f"), ("RSS+ MB", ">9.1f"),
               ("build s", ">8.1f")]
    print(text_table(columns, [[r["spec"], str(r["nlist"] or "-"), str(r.get("nprobe", "-")),
                                str(r.get("ef_search", "-")), r["recall"],
                                *[f"{r[f'p50_ms_b{b}']:.2f}/{r[f'p99_ms_b{b}']:.2f}" for b in args.batches],
                                r["disk_mb"], r["resident_mb"], r["build_s"]] for r in rows]))
    report = {"docs": args.docs, "vectors": args.vectors, "dim": args.dim, "queries": args.queries, "rows": rows}
    if args.auto:
        chosen = build_course(out / "auto", args.docs, index="auto", progress=False, force=True, vectors=args.vectors,
                              dim=args.dim,
                              recall=RecallOptions(min_recall=args.min_recall, tune=True, queries=args.queries,
                                                   latency_budget_ms=args.latency_budget_ms))
        report["auto"] = chosen.manifest.index["auto"]
        print(f"--index auto chose {chosen.manifest.index['spec']}: recall@10 "
              f"{chosen.manifest.index['recall']['overall']} ({chosen.manifest.index['recall']['params']})")
    (out / "index_bench.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {index_bench_plot(out / 'index_bench.png', rows)} and {out / 'index_bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
