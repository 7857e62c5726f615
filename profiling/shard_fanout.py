"""Shards visited per query and each index node's load, centroid shards against hash shards.

    python -m profiling.shard_fanout [--data DIR | --docs 200000] [--vectors uniform|mixture] [--shards 2,4,8]
        [--small] [--simulate]

Course data: an unsharded course version (`--data DIR`, built by `python -m builders.data build --kind
course`), or one built here into the run folder (`--docs`, 20,000 with --small; `--vectors mixture`:
vectors drawn like real embeddings, builders.mixture_vectors, on which a query's nearest lists cluster in
few shards; uniform ones, the course's, spread every query's lists over nearly all). Queries are fresh
draws of the same distribution (seed + 1, not in the index); with --data, of the distribution its
manifest names. Per layout and shard count: the shards a
query is sent to (hash: all of them; centroid: those owning its nprobe nearest lists), the queries,
IVF lists and vectors each shard is asked to scan, and for centroid shards how many of --check
queries' top 10 equal the unsharded index's (ids and distances).

--simulate: the plan's 100 M and 1 B vectors of 768 floats (docs/scaling.md) with their nlist (65,536 and
262,144, divided by --sim-nlist-div) and nprobe, the vectors scaled down by --scale, drawn from a mixture
of unit-vector clumps (profiling.lib.shard_sim; --sim-vectors mixture: builders.mixture_vectors' draws)
rather than the course's uniform cube, the centroids drawn
from the same mixture (not trained), split in --sim-shards centroid shards, one process each, searched
through the router with the top 10 checked against the unsharded index. Which shards a query visits
depends on the centroids and the owners, not on how full the lists are, so the fan-out is the full
size's for these centroids; the vectors scanned are the full size's times scale x --sim-nlist-div (as
many lists probed, of that many times fewer, each holding scale x div times a full-size list's vectors).
Counts only, no timings: the fan-out, the queries, lists and vectors each shard is asked for; and computed
from the counts (marked so), each node's vectors at the full size and their bytes as IVF-Flat. The course
build's progress bars (on a terminal) show its elapsed time and rate: the build's, not the fan-out's.
Writes shard_fanout.json into --out or a fresh runs/shard_fanout-<UTC time>/.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from builders.centroid_shards import list_sizes, split_index
from builders.mixture_vectors import VECTOR_SOURCES, course_vector_batches
from pipeline.centroid_routing import METHODS, CentroidRouter, assign_lists
from pipeline.centroid_search import CentroidShardedIndex
from pipeline.spec import EMBED_DIM
from profiling.lib.cli import add_out, comma_list, make_parser, positive
from profiling.lib.report import run_folder, text_table, write_json
from profiling.lib.shard_sim import (
    SCENARIOS,
    count_load,
    full_size_nodes,
    mixture_vectors,
    sampled_ivf,
    scaled,
    shard_shares,
    simulate,
)

COLUMNS = [("layout", "<16"), ("shards", ">7"), ("shards/query", ">13.2f"), ("max", ">5"),
           ("queries/shard", ">15"), ("lists/query", ">12.1f"), ("vectors/query", ">14.0f"),
           ("busiest shard", ">14.0f"), ("top10 equal", ">12")]


def _parser():
    parser = make_parser("python -m profiling.shard_fanout", __doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="an unsharded course version's directory (else one is built)")
    parser.add_argument("--docs", type=positive(int), default=200_000, help="documents of the course build made here")
    parser.add_argument("--vectors", choices=VECTOR_SOURCES, default="uniform",
                        help="the course build's vectors: uniform (the course's) or mixture (drawn like real embeddings)")
    parser.add_argument("--course-dim", type=positive(int), default=EMBED_DIM, help="the course build's vector width")
    parser.add_argument("--small", action="store_true", help="a quick check: 20,000 documents, 200 queries")
    parser.add_argument("--shards", type=comma_list(int, minimum=2, sort_unique=True), default=[2, 4, 8])
    parser.add_argument("--queries", type=positive(int), default=1000)
    parser.add_argument("--check", type=positive(int), default=200, help="queries whose top 10 is compared")
    parser.add_argument("--nprobe", type=positive(int), default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--simulate", action="store_true", help="also the 100 M / 1 B simulation in processes")
    parser.add_argument("--scale", type=float, default=1e-4, help="the simulation's vectors per full-size vector")
    parser.add_argument("--sim-shards", type=comma_list(int, minimum=2, sort_unique=True), default=[8, 16])
    parser.add_argument("--sim-nlist-div", type=positive(int), default=4,
                        help="the simulation's nlist: the full-size one divided by this (each shard process holds "
                             "every centroid: 1 B's 262,144 take 805 MB per process)")
    parser.add_argument("--dim", type=positive(int), default=768, help="the simulation's dimension")
    parser.add_argument("--sim-vectors", choices=("clumps", "mixture"), default="clumps",
                        help="the simulation's vectors: 256 random clumps on the sphere (profiling.lib.shard_sim), or "
                             "the mixture fitted to real embeddings (builders.mixture_vectors)")
    add_out(parser, "shard_fanout")
    return parser


def course_index(args, out: Path) -> faiss.IndexIVF:
    from builders.data import build_course
    from builders.recall import RecallOptions
    if args.data is None:
        # Fan-out and equality with the unsharded top 10 at the same nprobe are measured, not recall: uniform
        # course vectors are under the recall floor at any practical nprobe (builders/recall.py).
        result = build_course(out / "course", 20_000 if args.small else args.docs, nprobe=args.nprobe, seed=args.seed,
                              progress=sys.stderr.isatty(), recall=RecallOptions(accept_low=True),
                              vectors=args.vectors, dim=args.course_dim)
        path = result.index_path
    else:
        path = args.data / "faiss_index.bin"
        if not path.is_file():
            raise SystemExit(f"error: {path} is missing: --data names an unsharded course version")
    index = faiss.read_index(os.fspath(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    if not isinstance(index, faiss.IndexIVF):
        raise SystemExit(f"error: {path} is a {type(index).__name__}, not an IVF index")
    index.nprobe = min(args.nprobe, index.nlist)
    return index


def vector_source(args) -> str:
    """What the course vectors were drawn from: --vectors, or for --data what its manifest's embedder says."""
    if args.data is None:
        return args.vectors
    from pipeline.data_version import read_manifest
    return "mixture" if "mixture" in read_manifest(args.data).embedder.source else "uniform"


def layouts(index: faiss.IndexIVF, queries: np.ndarray, shard_counts: list[int], check: int) -> list[dict[str, Any]]:
    """Hash and centroid (each balance method) rows for every shard count."""
    probed = index.quantizer.search(queries, index.nprobe)[1]
    centroids, sizes = index.quantizer.reconstruct_n(0, index.nlist), list_sizes(index)
    expected_distances, expected_ids = index.search(queries[:check], 10)
    rows = []
    for shards in shard_counts:
        rows.append(count_load("hash", probed, shard_shares(index, shards, None), None).row())
        for method in METHODS:
            owners = assign_lists(centroids, sizes, shards, method)
            row = count_load(f"centroid/{method}", probed, shard_shares(index, shards, owners), owners).row()
            router = CentroidRouter(index.quantizer, owners, shards, index.nprobe)
            sharded = CentroidShardedIndex(router, [split_index(index, owners, shard) for shard in range(shards)])
            ids, distances = sharded.search(queries[:check], 10)
            row["top10_equal"] = int(((ids == expected_ids).all(axis=1)
                                      & (distances == expected_distances).all(axis=1)).sum())
            row["top10_checked"] = check
            rows.append(row)
    return rows


def simulation(args) -> list[dict[str, Any]]:
    results = []
    for scenario in SCENARIOS:
        n, nlist = scaled(scenario, args.scale, args.sim_nlist_div)
        drawn = (mixture_vectors(n + args.queries + nlist, args.dim, args.seed) if args.sim_vectors == "clumps" else
                 next(course_vector_batches(n + args.queries + nlist, args.dim, args.seed, n + args.queries + nlist,
                                            "mixture")))
        # Held out from the index: the queries and the centroids.
        vectors, queries, centroids = drawn[:n], drawn[n:n + args.queries], drawn[n + args.queries:]
        index = sampled_ivf(vectors, centroids, args.nprobe)
        probed = index.quantizer.search(queries, index.nprobe)[1]
        sizes = list_sizes(index)
        for shards in args.sim_shards:
            owners = assign_lists(centroids, sizes, min(shards, nlist), "kmeans")
            shares = {"centroid": shard_shares(index, shards, owners), "hash": shard_shares(index, shards, None)}
            counted = count_load("centroid/kmeans", probed, shares["centroid"], owners).row()
            hashed = count_load("hash", probed, shares["hash"], None).row()
            run = simulate(index, owners, queries)
            full_vectors, full_nlist = SCENARIOS[scenario]
            results.append({"scenario": scenario, "vectors_drawn": args.sim_vectors, "full_size_vectors": full_vectors,
                            "full_size_nlist": full_nlist, "vectors": n, "nlist": nlist,
                            "nprobe": index.nprobe, "dim": args.dim, "scale": args.scale, "centroid": counted,
                            "hash": hashed, "processes": run,
                            "full_size_computed": {layout: full_size_nodes(share, n, full_vectors, full_nlist, args.dim)
                                                   for layout, share in shares.items()}})
    return results


def _table(rows: list[dict[str, Any]]) -> str:
    return text_table(COLUMNS, [(r["layout"], r["shards"], r["shards_per_query_mean"], r["shards_per_query_max"],
                                 f"{r['queries_per_shard_min']:.0%}-{r['queries_per_shard_max']:.0%}",
                                 r["lists_per_query_all_shards"], r["vectors_per_query_all_shards"],
                                 r["vectors_per_query_busiest_shard"],
                                 f"{r['top10_equal']}/{r['top10_checked']}" if "top10_equal" in r else "-")
                                for r in rows])


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.small:
        args.queries, args.check = min(args.queries, 200), min(args.check, 100)
        args.scale, args.sim_nlist_div = min(args.scale, 2e-5), max(args.sim_nlist_div, 64)
    out = run_folder("shard_fanout", args.out)
    faiss.omp_set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    index = course_index(args, out)
    queries = next(course_vector_batches(args.queries, index.d, args.seed + 1, args.queries, vector_source(args)))
    report: dict[str, Any] = {"course": {"vectors": int(index.ntotal), "source": vector_source(args), "nlist": int(index.nlist),
                                         "nprobe": int(index.nprobe), "queries": args.queries,
                                         "rows": layouts(index, queries, args.shards, min(args.check, args.queries))}}
    print(f"course data ({vector_source(args)}): {index.ntotal} vectors of {index.d} floats, nlist {index.nlist}, nprobe {index.nprobe}, "
          f"{args.queries} queries")
    print(_table(report["course"]["rows"]))
    if args.simulate:
        report["simulation"] = simulation(args)
        for sim in report["simulation"]:
            run = sim["processes"]
            print(f"\n{sim['scenario']} ({sim['full_size_vectors']:,} vectors, nlist {sim['full_size_nlist']:,}) "
                  f"scaled to {sim['vectors']:,} vectors, nlist {sim['nlist']}, nprobe {sim['nprobe']}, "
                  f"{sim['dim']}-d {sim['vectors_drawn']} vectors (those scanned: the full size's x "
                  f"{sim['vectors'] * sim['full_size_nlist'] / (sim['full_size_vectors'] * sim['nlist']):.2g}); "
                  f"counted (no timings): {run['processes']} shard "
                  f"processes, {run['shards_per_query_mean']:.2f} shards/query, top 10 equal for "
                  f"{run['top10_equal_to_unsharded']}/{run['queries']}")
            print(_table([sim["hash"], sim["centroid"]]))
            print("  per process, counted (queries, lists, vectors scanned): " + ", ".join(
                f"{c['queries']}/{c['lists']}/{c['vectors']}" for c in run["per_shard"]))
            print("  computed for the full size (not measured): vectors per node " + "; ".join(
                f"{layout} {nodes['vectors_per_node_min'] / 1e6:,.1f}-{nodes['vectors_per_node_max'] / 1e6:,.1f} M, "
                f"the fullest {nodes['ivf_flat_bytes_per_node_max'] / 1e9:,.1f} GB as IVF-Flat with every centroid"
                for layout, nodes in sim["full_size_computed"].items()))
    path = write_json(out / "shard_fanout.json", report)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
