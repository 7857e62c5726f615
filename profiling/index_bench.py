"""Index kinds compared: recall@10, search latency, memory and build time, per kind and parameters.

    python -m profiling.index_bench [--docs 200000] [--vectors uniform|mixture] [--dim 768] [--index SPEC ...] [--nprobe 16,64,256]
        [--ef-search 32,64,128] [--batches 1,8,32] [--repeat 30] [--queries 500] [--out DIR] [--auto]

Each ``--index`` kind is built as ``builders.data build --kind course --docs N --vectors V --index SPEC``
builds it (its recall floor accepted: every figure is reported; ``--vectors mixture`` draws vectors shaped
like real embeddings, builders.mixture_vectors, where uniform ones make every IVF kind look bad), then served as the index node serves it: the
files memory-mapped by :class:`pipeline.vector_index.VectorIndex` behind the node's own search service
(:class:`services.roles.index.search.IndexService`, its batcher). For each nprobe (IVF) or efSearch
(HNSW): recall@10 against an exact search (builders.recall, the same queries for every kind, computed
once), search latency p50/p99 at each batch size (``--repeat`` calls), the bytes on disk and the growth
of this process's resident memory while serving it, and the build time.

What is shared between the kinds, and how the build time stays a build's: the builds run inside
builders.index_kinds.shared_training, so IVF-Flat, SQ8 and PQ (the same nlist on the same training
sample) run the coarse quantizer's k-means once; a build that reuses it has that k-means' measured
seconds added to its ``build_s`` (``train_reused_s`` says how much), so ``build_s`` is what the build
alone takes. OPQ trains its own (on the rotated vectors), bounded as every build bounds it
(index_kinds.OPQ_NITER). Every build measures its files' recall, as a build does, against the queries
and exact answers computed once here (the same seed, count and noise a build draws; builders.recall
``RecallOptions.reference``), and has the seconds they took (``reference_s``) added to its ``build_s``
too.

``--auto``: ``--index auto``'s rule (builders.auto_index.pick) applied to what was measured here, on
the full index: per kind the least nprobe / efSearch whose recall meets ``--min-recall`` (else its
best), its p50 at batch 32 against ``--latency-budget-ms``, its bytes on disk; then the pick is built
as ``builders.data build --index SPEC --tune`` (the least nprobe / efSearch on the doubling ladder
meeting the floor: at most the one measured here) and its manifest's ``index.auto`` records every
candidate's figures and the rule. ``builders.data build --index auto`` alone measures its candidates on
its training sample instead (builders.auto_index).

The default kinds leave out plain ``IVF,PQ96`` (``--index IVF,PQ96`` adds it): on the 768-d mixture at
200,000 it reached 0.79 at nprobe 256 where OPQ's rotation before the same codes reached 0.97, with the
same bytes (both keep the raw vectors for the re-ranking), so it is never the one to build, and its
build and loops were a sixth of the run.

``index_bench.json`` and ``index_bench.png`` under ``--out`` are rewritten as each kind finishes, and
each kind's rows printed, so a run stopped early keeps what it measured; the whole table is printed
at the end.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from builders.auto_index import LATENCY_BATCH, pick
from builders.build_files import BuildError
from builders.data import build_course, course_vector_batches
from builders.index_kinds import InvalidBuildArgument, SharedTraining, parse_index_spec, shared_training
from builders.mixture_vectors import VECTOR_SOURCES
from builders.recall import RecallOptions, exact_top_k, open_shards, sample_queries, served_recall
from pipeline.config import Settings
from pipeline.data_version import write_manifest
from pipeline.device import thread_budget
from pipeline.spec import EMBED_DIM
from profiling.lib.cli import add_out, comma_list, make_parser
from profiling.lib.index_node import node_memory, search_latencies_ms
from profiling.lib.plots import index_bench_plot
from profiling.lib.report import percentiles, run_folder, text_table
from services.roles.index.search import IndexService

DEFAULT_INDEXES = ("IVF,Flat", "IVF,SQ8", "OPQ96,IVF,PQ96", "HNSW32,Flat")  # IVF,PQ96: the module's docstring


def latency_ms(service: IndexService, queries: np.ndarray, batch: int, repeat: int) -> tuple[float, float]:
    """p50 and p99 ms of `repeat` in-process searches of `batch` queries."""
    p50, p99 = percentiles(search_latencies_ms(lambda q: service.search(q, 10, 60.0), queries, batch, repeat), (50, 99))
    return p50, p99


def bench_kind(spec: str, args, out: Path, queries, exact, shared: SharedTraining, reference_s: float) -> list[dict]:
    before, reused = node_memory(os.getpid())["rss"], shared.reused_s
    result = build_course(out / f"build-{len(list(out.glob('build-*')))}", args.docs, index=spec, progress=False,
                          force=True, recall=RecallOptions(accept_low=True, queries=args.queries,
                                                           reference=(queries, exact)),
                          vectors=args.vectors, dim=args.dim)
    train_reused_s = shared.reused_s - reused
    build_s = result.seconds + train_reused_s + reference_s  # what the build alone takes (the module's docstring)
    index = open_shards(result.index_files)[0]
    service = IndexService(index, max_size=max(args.batches), max_wait_ms=1.0, max_queue=4 * max(args.batches),
                           threads=thread_budget(Settings.from_env().index.faiss_threads))  # as a node's
    name, values = ("nprobe", args.nprobe) if index.nlist is not None else ("ef_search", args.ef_search)
    rows = []
    try:
        for value in values:
            setattr(index, name, value)
            recall = served_recall([index], queries, exact).overall
            row = {"spec": result.manifest.index["spec"], "nlist": index.nlist, name: getattr(index, name),
                   "recall": round(recall, 4), "build_s": round(build_s, 3),
                   "train_reused_s": round(train_reused_s, 3), "disk_mb": round(result.index_bytes / 1e6, 1),
                   "disk_bytes": result.index_bytes}
            for batch in args.batches:
                row[f"p50_ms_b{batch}"], row[f"p99_ms_b{batch}"] = latency_ms(service, queries.vectors, batch,
                                                                              args.repeat)
            row["resident_mb"] = round((node_memory(os.getpid())["rss"] - before) / 1e6, 1)
            rows.append(row)
    finally:
        service.close(5.0)
    return rows


def measured_candidates(rows: list[dict], floor: float) -> list[dict[str, Any]]:
    """Per kind, what --index auto's rule weighs: the least nprobe / efSearch measured whose recall meets
    ``floor`` (else the kind's best), its p50 at batch 32 and its bytes on disk."""
    found = []
    for spec in dict.fromkeys(r["spec"] for r in rows):
        mine = sorted((r for r in rows if r["spec"] == spec), key=lambda r: r.get("nprobe", r.get("ef_search", 0)))
        row = next((r for r in mine if r["recall"] >= floor), max(mine, key=lambda r: r["recall"]))
        param = {name: row[name] for name in ("nprobe", "ef_search") if name in row}
        found.append({"spec": spec, "recall": row["recall"], **param,
                      "search_ms_batch32": round(row[f"p50_ms_b{LATENCY_BATCH}"], 3), "bytes": row["disk_bytes"]})
    return found


def build_auto(args, out: Path, rows: list[dict], shared: SharedTraining, reference,
               reference_s: float) -> dict[str, Any]:
    """--index auto's pick among the kinds measured here, built (tuned to the floor); its manifest's record."""
    chosen, record = pick(measured_candidates(rows, args.min_recall), args.min_recall, args.latency_budget_ms,
                          size="bytes")
    reused = shared.reused_s
    record["measured_by"] = (f"profiling.index_bench on the full {args.docs} vectors: recall@10 on its "
                             f"{args.queries} queries, search_ms_batch32 the p50 of {args.repeat} searches through "
                             "the index service, bytes on disk")
    result = build_course(out / "auto", args.docs, index=chosen["spec"], nprobe=chosen.get("nprobe", 64),
                          progress=False, force=True, vectors=args.vectors, dim=args.dim,
                          recall=RecallOptions(min_recall=args.min_recall, tune=True, queries=args.queries,
                                               reference=reference))
    build_s = result.seconds + shared.reused_s - reused + reference_s  # as bench_kind's
    manifest = result.manifest
    assert manifest is not None  # a build that returns has written its manifest
    write_manifest(out / "auto", dataclasses.replace(manifest, index={**manifest.index, "auto": record}))
    return {**record, "built": {"spec": manifest.index["spec"], "recall": manifest.index["recall"]["overall"],
                                "params": manifest.index["recall"]["params"], "build_s": round(build_s, 1),
                                "version": manifest.version}}


def table(rows: list[dict], batches: list[int]) -> str:
    columns = [("kind", "<22"), ("nlist", ">6"), ("nprobe", ">7"), ("efS", ">5"), ("recall", ">8.4f"),
               *[(f"p50/p99 b{b} ms", ">18") for b in batches], ("disk MB", ">9.1f"), ("RSS+ MB", ">9.1f"),
               ("build s", ">8.1f")]
    return text_table(columns, [[r["spec"], str(r["nlist"] or "-"), str(r.get("nprobe", "-")),
                                 str(r.get("ef_search", "-")), r["recall"],
                                 *[f"{r[f'p50_ms_b{b}']:.2f}/{r[f'p99_ms_b{b}']:.2f}" for b in batches],
                                 r["disk_mb"], r["resident_mb"], r["build_s"]] for r in rows])


def write_report(out: Path, report: dict) -> None:
    """The JSON (written whole, then renamed: a run killed while writing keeps the previous one) and the plot."""
    temp = out / "index_bench.json.partial"
    temp.write_text(json.dumps(report, indent=2) + "\n")
    temp.replace(out / "index_bench.json")
    if report["rows"]:
        index_bench_plot(out / "index_bench.png", report["rows"])


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
    parser.add_argument("--auto", action="store_true",
                        help="also build what --index auto's rule picks from the kinds measured")
    add_out(parser, "index_bench")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.auto and LATENCY_BATCH not in args.batches:
        parser.error(f"--auto weighs the search of a batch of {LATENCY_BATCH}: --batches must include it")
    kinds = args.index or DEFAULT_INDEXES
    for spec in kinds:  # every spec checked before the first build, not after minutes of it
        try:
            parse_index_spec(spec, args.dim)
        except InvalidBuildArgument as exc:
            parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")  # the builds' stages
    out = run_folder("index_bench", args.out)
    started = time.perf_counter()
    vectors = partial(course_vector_batches, args.docs, args.dim, 0, source=args.vectors)
    queries = sample_queries(vectors, args.docs, args.queries, seed=0)
    exact = exact_top_k(queries.vectors, vectors)
    report: dict[str, Any] = {"docs": args.docs, "vectors": args.vectors, "dim": args.dim, "queries": args.queries,
                              "reference_s": round(time.perf_counter() - started, 1), "rows": []}
    code = 0
    with shared_training() as shared:
        for spec in kinds:
            rows = bench_kind(spec, args, out, queries, exact, shared, report["reference_s"])
            report["rows"] += rows
            write_report(out, report)
            print(table(rows, args.batches), flush=True)
        if args.auto:
            try:
                report["auto"] = build_auto(args, out, report["rows"], shared, (queries, exact), report["reference_s"])
                built = report["auto"]["built"]
                print(f"--index auto's rule picked {built['spec']}: built, recall@10 {built['recall']} "
                      f"({built['params']})")
            except BuildError as exc:
                report["auto"] = {"error": str(exc)}
                print(f"--auto: {exc}", file=sys.stderr)
                code = 2
    report["seconds"] = round(time.perf_counter() - started, 1)
    write_report(out, report)
    print(table(report["rows"], args.batches))
    print(f"wrote {out / 'index_bench.png'} and {out / 'index_bench.json'} ({report['seconds']} s)")
    return code


if __name__ == "__main__":
    sys.exit(main())
