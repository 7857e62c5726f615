"""The continuous engine's prefill with the prefix KV cache on and off, side by side.

    python -m profiling.bench_prefix_cache [--prompts 8] [--rounds 3] [--prefill-chunk 512]
                                           [--out runs/bench_prefix_cache]

Two engines on one model, one with the prefix cache (the prompt's fixed head,
Generator.prompt_head_ids, computed once and copied into each sequence), one
without. Each prompt is the SPEC prompt over ten support documents (the top
three, 200 characters each, as the generator builds it) with one of the
reference queries; each is added alone with one new token and the engine is
stepped until that token is out, so the time is the prompt's prefill plus one
token choice. The engines alternate prompt by prompt (the order flips each
round); the cached head is stored before timing starts. Prints the head's and
the prompts' token counts, the median prefill per engine, the ratio, and whether
the two chose the same first tokens. The model and precision come from the
environment (MODEL_SOURCE, STANDIN_PROFILE, DTYPE / GENERATE_PRECISION, TORCH_THREADS).
"""
from __future__ import annotations

import argparse
import statistics
import time

from pipeline.continuous import ContinuousEngine
from pipeline.generator import GenerationRequest, Generator
from profiling.lib.cli import add_out, make_parser, positive
from profiling.lib.inputs import DOCS_PER_RERANK, cycled, document_pool, spec_queries
from profiling.lib.models import worker_generator
from profiling.lib.provenance import local_record
from profiling.lib.report import run_folder, write_json

ENGINES = ("off", "on")


def requests(n: int) -> list[GenerationRequest]:
    """n SPEC prompts over ten support documents each, one new token apiece."""
    pool = document_pool(None)
    return [GenerationRequest(query, tuple(cycled(pool, DOCS_PER_RERANK, DOCS_PER_RERANK * i)), max_new_tokens=1)
            for i, query in enumerate(spec_queries(n))]


def prefill_seconds(engine: ContinuousEngine, request: GenerationRequest) -> tuple[float, int]:
    """Seconds from adding the request to its first token, and that token."""
    started = time.perf_counter()
    seq = engine.add(request)
    while engine.has_work():
        if engine.step().failed:
            raise RuntimeError("a prefill failed")
    return time.perf_counter() - started, seq.generated[0]


def measure(engines: dict[str, ContinuousEngine], prompts: list[GenerationRequest],
            rounds: int) -> dict[str, list[tuple[float, int]]]:
    """Every prompt on every engine, `rounds` times, alternating engines prompt by prompt."""
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in engines}
    for round_ in range(rounds):
        order = list(engines) if round_ % 2 == 0 else list(engines)[::-1]
        for request in prompts:
            for name in order:
                runs[name].append(prefill_seconds(engines[name], request))
    return runs


def report(generator: Generator, engines: dict[str, ContinuousEngine], prompts: list[GenerationRequest],
           runs: dict[str, list[tuple[float, int]]]) -> dict:
    head = len(generator.prompt_head_ids())
    lengths = [len(generator.tokenizer(generator.prompt(r.query, r.documents))["input_ids"]) for r in prompts]
    medians = {name: statistics.median(s for s, _ in runs[name]) for name in runs}
    stats = engines["on"].stats()
    return {
        "head_tokens": head, "prompt_tokens": {"min": min(lengths), "median": statistics.median(lengths),
                                               "max": max(lengths)},
        "head_share_of_prompt": round(head / statistics.median(lengths), 3),
        "prefill_ms_median": {name: round(1000 * m, 1) for name, m in medians.items()},
        "prefill_ms_min": {name: round(1000 * min(s for s, _ in runs[name]), 1) for name in runs},
        "on_vs_off": round(medians["on"] / medians["off"], 3),
        # Each prompt's on/off pair was timed back to back: the median of their ratios shrugs off slow spells.
        "on_vs_off_paired_median": round(statistics.median(a[0] / b[0] for a, b in zip(runs["on"], runs["off"])), 3),
        "same_first_tokens": sum(a[1] == b[1] for a, b in zip(runs["on"], runs["off"])),
        "timed_prefills_per_engine": len(runs["on"]),
        "prefix_cache": {"hits": stats.prefix_cache_hits_total, "misses": stats.prefix_cache_misses_total,
                         "tokens_saved": stats.prefix_cache_tokens_saved_total},
    }


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.bench_prefix_cache", __doc__)
    p.add_argument("--prompts", type=positive(int), default=8, help="distinct prompts (reference queries, cycled)")
    p.add_argument("--rounds", type=positive(int), default=3, help="times each prompt is timed per engine")
    p.add_argument("--prefill-chunk", type=positive(int), default=512,
                   help="prompt tokens prefilled per iteration (the service's GENERATE_PREFILL_CHUNK default)")
    add_out(p, "bench_prefix_cache")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import torch
    generator, source, placement = worker_generator()
    engines = {name: ContinuousEngine(generator, max_seqs=1, max_tokens=4096, prefill_chunk=args.prefill_chunk,
                                      prefix_cache=name == "on") for name in ENGINES}
    prompts = requests(args.prompts)
    for engine in engines.values():  # the first prefill of each: stores the head on "on", warms both
        prefill_seconds(engine, prompts[-1])
    runs = measure(engines, prompts, args.rounds)
    result = report(generator, engines, prompts, runs)
    result["settings"] = {"prompts": args.prompts, "rounds": args.rounds, "prefill_chunk": args.prefill_chunk,
                          "dtype": placement.dtype, "precision": placement.precision,
                          "torch_threads": torch.get_num_threads(), "model_source": source.describe()}
    med, low = result["prefill_ms_median"], result["prefill_ms_min"]
    print(f"[{placement.precision}, {torch.get_num_threads()} threads, {source.describe()}]")
    print(f"head {result['head_tokens']} tokens; prompts {result['prompt_tokens']} tokens "
          f"(head = {result['head_share_of_prompt']:.1%} of the median prompt)")
    print(f"prefill + first token, median (min) over {result['timed_prefills_per_engine']} each: "
          f"off {med['off']:.1f} ms ({low['off']:.1f}), on {med['on']:.1f} ms ({low['on']:.1f}); "
          f"on/off {result['on_vs_off']:.3f} (median of paired ratios {result['on_vs_off_paired_median']:.3f})")
    print(f"same first token on and off: {result['same_first_tokens']}/{result['timed_prefills_per_engine']}; "
          f"prefix cache {result['prefix_cache']}")
    result["provenance"] = local_record()
    path = write_json(run_folder("bench_prefix_cache", args.out) / f"bench_prefix_cache_{placement.precision}.json",
                      result)
    print(f"results in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
