"""Sharded search against unsharded at the same total size, side by side in one run.

    python -m profiling.bench_sharded_search --index DIR_A/faiss_index.bin --sharded-index DIR_B/faiss_index.bin
        --shards 2 [--batch 1,16] [--rounds 20] [--nprobe 64] [--threads 1] [--out DIR]

`--index` is an unsharded index; `--sharded-index` names the same data built with
`python -m builders.data build ... --shards N` (its shard files lie beside that name). The tool
starts one real index node (a separate process on 127.0.0.1) on the unsharded file and N index
nodes on the shards, each with `--threads` faiss threads, then times batches of unit vectors
both ways, interleaved so machine noise hits both alike: one IndexClient call to the single node,
and a ShardedIndexClient search (every shard at once, the top 10 merged on the caller's side),
as a worker searches. It checks that both return the same ids (an IVF shard build shares the
unsharded quantizer, so they must), prints each way's median batch latency and queries/s, the
ratio, and writes bench_sharded_search.json into --out or a fresh runs/ folder.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

from pipeline.shards import shard_path
from pipeline.vector_index import VectorIndex
from profiling.bench_search import start_index_server, timed, wait_ready
from profiling.lib.cli import add_out, make_parser
from profiling.lib.provenance import local_record
from profiling.lib.report import run_folder, write_json
from services.cluster.clients import IndexClient
from tools.local import free_ports
from services.cluster.sharded_index import ShardedIndexClient


def parser():
    p = make_parser("python -m profiling.bench_sharded_search", __doc__)
    p.add_argument("--index", required=True, help="the unsharded FAISS index file")
    p.add_argument("--sharded-index", required=True, help="the sharded build's FAISS_INDEX_PATH (shard files beside it)")
    p.add_argument("--shards", type=int, required=True, help="how many shards the sharded build has")
    p.add_argument("--batch", default="1,16", help="query vectors per search, one or more sizes")
    p.add_argument("--rounds", type=int, default=20, help="timed batches each way, per batch size")
    p.add_argument("--nprobe", type=int, default=64, help="IVF lists probed, both ways")
    p.add_argument("--threads", type=int, default=1, help="faiss threads of each index node")
    add_out(p, "bench_sharded_search")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sizes = [int(b) for b in args.batch.split(",") if b.strip()]
    paths = [shard_path(args.sharded_index, k, args.shards) for k in range(args.shards)]
    missing = [str(p) for p in [Path(args.index), *paths] if not p.is_file()]
    if args.shards < 2 or missing or not sizes or min(sizes) < 1 or args.rounds < 1:
        print(f"bench_sharded_search: need --shards >= 2, --rounds >= 1, batch sizes >= 1 and the files "
              f"(missing: {', '.join(missing) or 'none'})", file=sys.stderr)
        return 2
    dim = VectorIndex.load(args.index, nprobe=args.nprobe).dim
    ports = free_ports(1 + args.shards)
    servers = [start_index_server(Path(args.index), ports[0], args.nprobe, args.threads)]
    servers += [start_index_server(path, port, args.nprobe, args.threads) for path, port in zip(paths, ports[1:])]
    try:
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        ready_s = [round(wait_ready(url), 2) for url in urls]
        single = IndexClient(urls[0], connect_timeout_s=3, read_timeout_s=120)
        sharded = ShardedIndexClient([IndexClient(url, connect_timeout_s=3, read_timeout_s=120,
                                                  name=f"index shard {k} of {args.shards}")
                                      for k, url in enumerate(urls[1:])])
        results = {size: measure(single, sharded, dim, size, args.rounds) for size in sizes}
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=60)
    report = {"index": args.index, "sharded_index": args.sharded_index, "shards": args.shards,
              "nprobe": args.nprobe, "threads_per_node": args.threads, "rounds": args.rounds,
              "ready_s": ready_s, "by_batch": results, "provenance": local_record()}
    print(f"{'batch':>6}{'unsharded ms':>14}{'sharded ms':>12}{'unsharded q/s':>15}{'sharded q/s':>13}"
          f"{'sharded/unsharded time':>24}  same ids")
    for size, r in results.items():
        print(f"{size:>6}{r['unsharded_ms']:>14.2f}{r['sharded_ms']:>12.2f}{r['unsharded_qps']:>15.1f}"
              f"{r['sharded_qps']:>13.1f}{r['time_ratio']:>24.2f}  {r['same_ids']}")
    out = run_folder("bench_sharded_search", args.out)
    print(f"results in {write_json(out / 'bench_sharded_search.json', report)}")
    return 0 if all(r["same_ids"] for r in results.values()) else 1


def measure(single: IndexClient, sharded: ShardedIndexClient, dim: int, size: int, rounds: int) -> dict:
    rng = np.random.default_rng(size)
    batches = []
    for _ in range(rounds + 2):
        v = rng.standard_normal((size, dim)).astype(np.float32)
        batches.append(v / np.linalg.norm(v, axis=1, keepdims=True))
    deadline = time.monotonic() + 600
    same = all(single.search(b, 10, deadline=deadline)[0] == sharded.search(b, 10, deadline=deadline)[0]
               for b in batches)  # also warms both: memory-mapped pages resident for both
    one, many = [], []
    for batch in batches[2:]:  # interleaved
        one += timed(lambda b: single.search(b, 10, deadline=deadline), [batch])
        many += timed(lambda b: sharded.search(b, 10, deadline=deadline), [batch])
    one_s, many_s = statistics.median(one), statistics.median(many)
    return {"unsharded_ms": one_s * 1000, "sharded_ms": many_s * 1000, "unsharded_qps": size / one_s,
            "sharded_qps": size / many_s, "time_ratio": many_s / one_s, "same_ids": same}


if __name__ == "__main__":
    sys.exit(main())
