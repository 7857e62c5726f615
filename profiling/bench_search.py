"""/search over HTTP against in-process faiss, same index, batch and nprobe, one run.

    python -m profiling.bench_search --index PATH [--batch 16] [--rounds 20] [--out DIR]

Starts node 2 (the real index server, a separate process on 127.0.0.1) on the
same index file, then times batches of unit vectors both ways: through
`IndexClient` (JSON over HTTP, node 2's BatchingService, faiss) and through
`VectorIndex.search` in this process. Prints queries/s for each and the ratio
(the performance target is HTTP >= 0.8x in-process), plus what loading costs:
the in-process load time, the first (cold) batch, this process's RSS after the
load, the cold batch and the warm-up, and node 2's time to /health 200 and its
RSS (from its /metrics) after serving the same batches. RSS counts the index
file's pages that searches touched (the index is memory-mapped), so it grows
with the lists probed, not with the file's size. A node 2 whose /metrics cannot be
read stops the tool (exit 1). Writes bench_search.json (with the tool's git commit,
this process's settings and node 2's) into --out, or a fresh
runs/bench_search-<UTC time>/ folder.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pipeline.config import REPO_ROOT
from pipeline.vector_index import VectorIndex
from profiling.lib.cli import add_out, make_parser
from profiling.lib.cluster import ClusterError, Node, scrape_nodes
from profiling.lib.prometheus import PEAK_RSS_METRIC, RSS_METRIC, MetricsSnapshot
from profiling.lib.provenance import cluster_record, local_record
from profiling.lib.report import run_folder, write_json
from services.cluster.clients import IndexClient
from services.cluster.health_wait import wait_healthy
from tools.local import free_ports


def rss_mib() -> float:
    """This process's resident set now (Linux /proc; NaN elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def node_rss_mib(snapshot: MetricsSnapshot) -> dict[str, float]:
    return {name: round((snapshot.get(metric) or float("nan")) / 2**20, 1) for name, metric in
            (("rss", RSS_METRIC), ("peak_rss", PEAK_RSS_METRIC))}


def start_index_server(index: Path, port: int, nprobe: int, threads: int) -> subprocess.Popen:
    env = {**os.environ, "NODE_NUMBER": "2", "NODE_2_IP": f"127.0.0.1:{port}", "FAISS_INDEX_PATH": str(index),
           "NPROBE": str(nprobe), "FAISS_THREADS": str(threads), "LOG_LEVEL": "warning"}
    return subprocess.Popen([sys.executable, "-m", "services.node"], env=env, cwd=REPO_ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_ready(url: str, timeout_s: float = 300) -> float:
    """Seconds until node 2 answers /health 200 (polled often: the time is reported)."""
    started = time.monotonic()
    wait_healthy(url, timeout_s, poll_s=0.1, request_timeout_s=2)
    return time.monotonic() - started


def timed(fn, batches) -> list[float]:
    times = []
    for batch in batches:
        started = time.perf_counter()
        fn(batch)
        times.append(time.perf_counter() - started)
    return times


def parser():
    p = make_parser("python -m profiling.bench_search", __doc__)
    p.add_argument("--index", required=True, help="the FAISS index file, served by node 2 and loaded here")
    p.add_argument("--batch", type=int, default=16, help="query vectors per search")
    p.add_argument("--rounds", type=int, default=20, help="timed batches each way")
    p.add_argument("--nprobe", type=int, default=64, help="IVF lists probed, both ways")
    p.add_argument("--threads", type=int, default=2, help="faiss threads, both ways")
    add_out(p, "bench_search")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import faiss
    faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    rss = {"before_load": rss_mib()}
    started = time.perf_counter()
    index = VectorIndex.load(args.index, nprobe=args.nprobe)
    load_s = time.perf_counter() - started
    rss["after_load"] = rss_mib()
    batches = []
    for _ in range(args.rounds + 2):
        v = rng.standard_normal((args.batch, index.dim)).astype(np.float32)
        batches.append(v / np.linalg.norm(v, axis=1, keepdims=True))
    first_batch_s = timed(lambda b: index.search(b, 10), batches[:1])[0]
    rss["after_first_batch"] = rss_mib()
    port = free_ports(1)[0]
    server = start_index_server(Path(args.index), port, args.nprobe, args.threads)
    try:
        url = f"http://127.0.0.1:{port}"
        ready_s = wait_ready(url)
        client = IndexClient(url, connect_timeout_s=3, read_timeout_s=120)
        # Warm both paths over every batch first: memory-mapped pages are then resident for both.
        timed(lambda b: index.search(b, 10), batches)
        timed(lambda b: client.search(b, 10), batches)
        local, http = [], []
        for batch in batches[2:]:  # interleaved, so machine noise hits both alike
            local += timed(lambda b: index.search(b, 10), [batch])
            http += timed(lambda b: client.search(b, 10), [batch])
        rss["after_all_batches"] = rss_mib()
        node = Node(2, url, "index")
        snapshot, = scrape_nodes([node])
        node2 = node_rss_mib(snapshot)
        provenance = {**local_record(), "nodes": cluster_record([node], [snapshot])["nodes"]}
    except ClusterError as exc:
        print(f"bench_search: {exc}", file=sys.stderr)
        return 1
    finally:
        server.terminate()
        server.wait(timeout=60)
    qps = {name: args.batch / statistics.median(t) for name, t in (("in_process", local), ("http", http))}
    report = {"index": args.index, "ntotal": index.ntotal, "batch": args.batch, "nprobe": index.nprobe,
              "rounds": args.rounds, "file_gb": round(Path(args.index).stat().st_size / 1e9, 2),
              "mmap": index.is_mmap, "load_s": round(load_s, 4), "first_batch_s": round(first_batch_s, 3),
              "rss_mib": {k: round(v, 1) for k, v in rss.items()}, "node2_ready_s": round(ready_s, 2),
              "node2_rss_mib": node2,
              "median_batch_s": {"in_process": statistics.median(local), "http": statistics.median(http)},
              "queries_per_s": qps, "ratio_http_vs_in_process": qps["http"] / qps["in_process"],
              "provenance": provenance}
    print(json.dumps({k: v for k, v in report.items() if k != "provenance"}, indent=2))
    print(f"HTTP / in-process: {report['ratio_http_vs_in_process']:.2f}x (target >= 0.8x)")
    path = write_json(run_folder("bench_search", args.out) / "bench_search.json", report)
    print(f"results in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
