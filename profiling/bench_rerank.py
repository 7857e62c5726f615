"""The reranker's forwards grouped by length against one padded forward, side by side.

    python -m profiling.bench_rerank [--requests 8] [--rounds 2] [--pad-ratios 1.1,1.25]
                                     [--documents DIR] [--out DIR]

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
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from pipeline.config import Settings
from pipeline.device import placement_for, thread_budget
from pipeline.models import resolve_model_source
from pipeline.reranker import Reranker, length_groups
from profiling.lib.cli import add_out, comma_list, make_parser
from profiling.lib.inputs import document_pool, rerank_inputs
from profiling.lib.provenance import local_record
from profiling.lib.report import run_folder, write_json

ONE_FORWARD = float("inf")


# Kept in the order given: the report lists the settings that way.
parse_ratios = comma_list(float, minimum=1.0, what="pad ratios", example="1.1,1.25")


def time_setting(reranker: Reranker, requests, ratio: float) -> tuple[float, list[list[float]]]:
    reranker.max_pad_ratio = ratio
    started = time.perf_counter()
    scores = [reranker.score_pairs([(r.query, d.content) for d in r.documents]) for r in requests]
    return (time.perf_counter() - started) / len(requests), scores


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.bench_rerank", __doc__)
    p.add_argument("--requests", type=int, default=8, help="rerank requests of ten documents")
    p.add_argument("--rounds", type=int, default=2, help="timed rounds (the best is reported)")
    p.add_argument("--pad-ratios", type=parse_ratios, default=[1.1, 1.25],
                   help="length-grouping settings compared with one padded forward")
    p.add_argument("--documents", type=Path, default=None,
                   help="folder holding documents.db; unset: the support corpus")
    add_out(p, "bench_rerank")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.requests < 1 or args.rounds < 1:
        p.error("--requests and --rounds must be at least 1")

    import torch
    settings = Settings.from_env()
    torch.set_num_threads(thread_budget(settings.models.torch_threads))
    reranker = Reranker.load(resolve_model_source(settings), placement_for(settings, Reranker.stage))
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
