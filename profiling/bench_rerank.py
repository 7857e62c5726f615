"""The reranker's forwards grouped by length against one padded forward, side by side; or,
with --batching, the rerank stage's batches closed by count against closed by tokens.

    python -m profiling.bench_rerank [--requests 8] [--rounds 2] [--pad-ratios 1.1,1.25]
                                     [--documents DIR] [--out DIR]
    python -m profiling.bench_rerank --batching [--concurrency 1,4,8] [--budgets 4096,8192]
                                     [--max-batches 1,8] [--rounds 1] [--documents DIR]

Each request is a SPEC query with 10 documents (what search and fetch hand the
reranker), drawn from documents.db under --documents or from the support corpus.
Every round times the same requests once per setting, interleaved so that a
noisy machine slows all settings alike: `one forward` pads all of a request's
pairs to its longest (max_pad_ratio = inf, the stage before length grouping);
each --pad-ratios value lets pairs share a forward only while its padded tokens
stay within that ratio of its real tokens (pipeline.reranker.length_groups).
Prints seconds per request (the best round) and each setting's speed-up, checks
that the scores agree, and writes JSON. Use STANDIN_PROFILE=faithful
MODEL_SOURCE=standin for faithful figures.

--batching runs the stage as the worker does (a BatchingService over
Reranker.rerank, each request's cost in tokens computed by its submitter):
--concurrency requests arrive at once (threads past a barrier), under each
setting in turn, interleaved per round: `count N` closes a batch at N requests
(RERANK_MAX_BATCH=N), `tokens T` at T padded tokens (RERANK_MAX_BATCH_TOKENS=T,
with RERANK_MAX_BATCH=16). Batched settings wait up to --max-wait-ms for
the others to arrive. Prints throughput and per-request latency (mean, max).
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from pipeline.device import placement_for
from pipeline.reranker import Reranker, length_groups
from profiling.lib.cli import add_out, comma_list, make_parser
from profiling.lib.inputs import document_pool, rerank_inputs
from profiling.lib.models import worker_settings
from profiling.lib.provenance import local_record
from profiling.lib.report import run_folder, write_json
from services.stages.batching import BatchingService
from services.stages.token_policy import BatchTokens, TokenPolicy

ONE_FORWARD = float("inf")
TOKEN_BATCH_ITEMS = 16  # RERANK_MAX_BATCH under a token budget: the budget closes batches first


# Kept in the order given: the report lists the settings that way.
parse_ratios = comma_list(float, minimum=1.0, what="pad ratios", example="1.1,1.25")


def time_setting(reranker: Reranker, requests, ratio: float) -> tuple[float, list[list[float]]]:
    reranker.max_pad_ratio = ratio
    started = time.perf_counter()
    scores = [reranker.score_pairs([(r.query, d.content) for d in r.documents]) for r in requests]
    return (time.perf_counter() - started) / len(requests), scores


def run_at_once(reranker: Reranker, requests, max_batch: int, budget: int | None, max_wait_ms: float) -> dict:
    """The requests submitted at once from one thread each to a fresh rerank stage service."""
    service = BatchingService("rerank", reranker.rerank, max_size=max_batch, max_wait_ms=max_wait_ms,
                              tokens=TokenPolicy(BatchTokens.SUMMED, budget))
    latencies = [0.0] * len(requests)
    start = threading.Barrier(len(requests) + 1)

    def client(i: int) -> None:
        start.wait()
        submitted = time.perf_counter()
        service.submit(requests[i], cost=reranker.request_tokens(requests[i])).result(timeout=600)
        latencies[i] = time.perf_counter() - submitted

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    stats = service.stats()
    service.close()
    return {"wall_s": wall, "latencies_s": latencies, "batches": stats.batches_total,
            "tokens": stats.tokens_total, "max_batch_tokens": stats.max_batch_tokens_seen}


def batching(reranker: Reranker, pool, args) -> dict:
    import torch
    requests = rerank_inputs(pool, max(args.concurrency))
    costs = [reranker.request_tokens(r) for r in requests]
    settings_order = [(f"count {n}", n, None) for n in args.max_batches]
    settings_order += [(f"tokens {t}", TOKEN_BATCH_ITEMS, t) for t in args.budgets]
    reranker.rerank(requests)  # warm-up: every shape a batch of them all can take
    runs: dict[tuple[int, str], list[dict]] = {}
    for _ in range(args.rounds):
        for concurrency in args.concurrency:
            for name, max_batch, budget in settings_order:
                run = run_at_once(reranker, requests[:concurrency], max_batch, budget,
                                  0.0 if max_batch == 1 else args.max_wait_ms)
                runs.setdefault((concurrency, name), []).append(run)
    print(f"{len(requests)} requests x {len(requests[0].documents)} pairs, {torch.get_num_threads()} torch threads, "
          f"request tokens {min(costs)}-{max(costs)} (mean {np.mean(costs):.0f}), "
          f"{reranker.placement.device}/{reranker.placement.dtype}")
    print(f"{'at once':>7} {'setting':<12} {'req/s':>7} {'mean s':>7} {'max s':>7} {'batches':>8} "
          f"{'tokens/s':>9} {'largest batch tokens':>21}")
    rows = []
    for (concurrency, name), done in runs.items():
        best = min(done, key=lambda run: run["wall_s"])  # the least disturbed round on a shared machine
        row = {"concurrency": concurrency, "setting": name, "requests_per_s": concurrency / best["wall_s"],
               "mean_latency_s": statistics.fmean(best["latencies_s"]), "max_latency_s": max(best["latencies_s"]),
               "batches": best["batches"], "tokens_per_s": best["tokens"] / best["wall_s"],
               "max_batch_tokens": best["max_batch_tokens"], "rounds": done}
        rows.append(row)
        print(f"{concurrency:>7} {name:<12} {row['requests_per_s']:>7.3f} {row['mean_latency_s']:>7.2f} "
              f"{row['max_latency_s']:>7.2f} {row['batches']:>8} {row['tokens_per_s']:>9.0f} "
              f"{row['max_batch_tokens']:>21}")
    return {"mode": "batching", "rounds": args.rounds, "max_wait_ms": args.max_wait_ms,
            "torch_threads": torch.get_num_threads(),
            "request_tokens": {"min": min(costs), "max": max(costs), "mean": float(np.mean(costs))}, "rows": rows}


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.bench_rerank", __doc__)
    p.add_argument("--requests", type=int, default=8, help="rerank requests of ten documents")
    p.add_argument("--rounds", type=int, default=2, help="timed rounds (the best is reported)")
    p.add_argument("--pad-ratios", type=parse_ratios, default=[1.1, 1.25],
                   help="length-grouping settings compared with one padded forward")
    p.add_argument("--documents", type=Path, default=None,
                   help="folder holding documents.db; unset: the support corpus")
    p.add_argument("--batching", action="store_true",
                   help="compare the stage's batches closed by count and by tokens instead")
    p.add_argument("--concurrency", type=comma_list(int, minimum=1, what="concurrencies", example="1,4,8"),
                   default=[1, 4, 8], help="--batching: requests arriving at once")
    p.add_argument("--max-batches", type=comma_list(int, minimum=1, what="batch sizes", example="1,8"),
                   default=[1, 8], help="--batching: count-closed settings (RERANK_MAX_BATCH)")
    p.add_argument("--budgets", type=comma_list(int, minimum=1, what="token budgets", example="4096,8192"),
                   default=[4096, 8192], help="--batching: token-closed settings (RERANK_MAX_BATCH_TOKENS)")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="--batching: the batched settings' window")
    add_out(p, "bench_rerank")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.requests < 1 or args.rounds < 1:
        p.error("--requests and --rounds must be at least 1")

    import torch
    settings, source = worker_settings()
    reranker = Reranker.load(source, placement_for(settings, Reranker.stage))
    if args.batching:
        report = batching(reranker, document_pool(args.documents), args)
        report["provenance"] = local_record()
        print(f"results in {write_json(run_folder('bench_rerank', args.out) / 'bench_rerank.json', report)}")
        return 0
    requests = rerank_inputs(document_pool(args.documents), args.requests)
    lengths = [[len(ids) for ids in reranker.encode_pairs([(r.query, d.content) for d in r.documents])["input_ids"]]
               for r in requests]
    settings_order = [ONE_FORWARD, *args.pad_ratios]
    time_setting(reranker, requests[:1], ONE_FORWARD)  # warm-up
    seconds: dict[float, list[float]] = {ratio: [] for ratio in settings_order}
    scores: dict[float, list[list[float]]] = {}
    for _ in range(args.rounds):
        for ratio in settings_order:
            per_request, scores[ratio] = time_setting(reranker, requests, ratio)
            seconds[ratio].append(per_request)
    base = min(seconds[ONE_FORWARD])
    rows = []
    for ratio in settings_order:
        forwards = sum(len(length_groups(ls, reranker.max_pairs_per_forward, ratio)) for ls in lengths)
        diff = float(np.max(np.abs(np.array(scores[ratio]) - np.array(scores[ONE_FORWARD]))))
        rows.append({"setting": "one forward" if ratio == ONE_FORWARD else f"pad ratio {ratio}",
                     "max_pad_ratio": None if ratio == ONE_FORWARD else ratio,
                     "seconds_per_request": min(seconds[ratio]), "rounds_s": seconds[ratio],
                     "forwards_per_request": forwards / len(requests), "speedup": base / min(seconds[ratio]),
                     "max_score_diff": diff})
    all_lengths = [n for ls in lengths for n in ls]
    print(f"{len(requests)} requests x {len(lengths[0])} pairs, {torch.get_num_threads()} torch threads, "
          f"pair tokens {min(all_lengths)}-{max(all_lengths)} (mean {np.mean(all_lengths):.0f}), "
          f"{reranker.placement.device}/{reranker.placement.dtype}")
    print(f"{'setting':<16} {'s/request':>10} {'forwards':>9} {'speed-up':>9} {'max |score diff|':>17}")
    for row in rows:
        print(f"{row['setting']:<16} {row['seconds_per_request']:>10.3f} {row['forwards_per_request']:>9.1f} "
              f"{row['speedup']:>8.2f}x {row['max_score_diff']:>17.2e}")
    report = {"requests": len(requests), "rounds": args.rounds, "torch_threads": torch.get_num_threads(),
              "pair_tokens": {"min": min(all_lengths), "max": max(all_lengths),
                              "mean": float(np.mean(all_lengths))},
              "rows": rows}
    report["provenance"] = local_record()
    path = write_json(run_folder("bench_rerank", args.out) / "bench_rerank.json", report)
    print(f"results in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
