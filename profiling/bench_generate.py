"""Continuous batching against the reference and static batching, side by side.

    python -m profiling.bench_generate [--requests 16] [--stagger 1.0] [--max-batch 8]
                                       [--answer-lengths 128 | uniform:LOW:HIGH]

The same staggered arrivals (request i at i * stagger seconds) are served three
ways in one run: (1) the reference, one request at a time in float32; (2) static
batches through `generate` (BatchingService, same max batch and dtype as 3);
(3) continuous batching. Prints aggregate generated tokens/s (all tokens over
first arrival to last answer), latencies, time to first token, and the ratios
the performance issue sets as targets. Use STANDIN_PROFILE=faithful
MODEL_SOURCE=standin for faithful figures.

Random-weight stand-ins never emit eos, so every answer runs the full 128
tokens. `--answer-lengths uniform:LOW:HIGH` models real answers that end
early: request i's answer ends after a seeded length drawn from LOW..HIGH, in
every mode alike (greedy decoding makes the first L tokens the same whether
the answer stops there or not). A static batch then runs as long as its
longest answer, its finished rows computing padding, as `generate` does with
eos; continuous batching frees the slot at once.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from builders.corpus import support_documents
from pipeline import spec
from pipeline.continuous import ContinuousEngine
from pipeline.device import Placement, placement_for
from pipeline.generator import GenerationRequest, Generator
from profiling.lib.cli import add_out, make_parser
from profiling.lib.models import worker_settings
from profiling.lib.provenance import local_record
from profiling.lib.report import percentiles, run_folder, write_json
from services.stages.batching import BatchingService
from services.stages.continuous import ContinuousGenerationService


@dataclass
class RunResult:
    mode: str
    dtype: str
    requests: int
    tokens: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    ttft_admitted: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def summary(self) -> dict:
        def p50_p95(name: str, values: list[float], digits: int, empty=None) -> dict:
            if not values and empty is None:
                return {f"{name}_p50_s": None, f"{name}_p95_s": None}
            p50, p95 = percentiles(values, (50, 95))
            return {f"{name}_p50_s": round(p50, digits), f"{name}_p95_s": round(p95, digits)}
        return {"mode": self.mode, "dtype": self.dtype, "requests": self.requests, "tokens": self.tokens,
                "seconds": round(self.seconds, 2), "tokens_per_s": round(self.tokens_per_s, 2),
                **p50_p95("latency", self.latencies, 2, empty="nan"), **p50_p95("ttft", self.ttft, 3),
                **p50_p95("ttft_after_admission", self.ttft_admitted, 3)}


def parse_answer_lengths(text: str) -> tuple[int, int]:
    """'128' or 'uniform:LOW:HIGH' -> (low, high), both within 1..MAX_NEW_TOKENS."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            low = high = int(parts[0])
        elif len(parts) == 3 and parts[0] == "uniform":
            low, high = int(parts[1]), int(parts[2])
        else:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or uniform:LOW:HIGH, got {text!r}") from None
    if not 1 <= low <= high <= spec.MAX_NEW_TOKENS:
        raise argparse.ArgumentTypeError(f"answer lengths must satisfy 1 <= LOW <= HIGH <= {spec.MAX_NEW_TOKENS}")
    return low, high


def make_requests(n: int, lengths: tuple[int, int] = (spec.MAX_NEW_TOKENS, spec.MAX_NEW_TOKENS),
                  seed: int = 0) -> list[GenerationRequest]:
    """Requests whose answers end (as if at eos) after a seeded number of new tokens (max_new_tokens)."""
    docs = list(support_documents(60, seed=0))
    rng = random.Random(seed)
    return [GenerationRequest(spec.REFERENCE_QUERIES[i % 8], tuple(docs[(3 * i) % 57:(3 * i) % 57 + 3]),
                              max_new_tokens=rng.randint(*lengths))
            for i in range(n)]


def arrive(requests, stagger_s: float, submit) -> tuple[float, list[float]]:
    """Call submit(i, request) at each arrival time; returns (start, arrival times)."""
    start = time.monotonic()
    arrivals = []
    for i, request in enumerate(requests):
        delay = start + i * stagger_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # an open-loop arrival schedule, not a wait for a result
        arrivals.append(time.monotonic())
        submit(i, request)
    return start, arrivals


def run_reference(generator: Generator, requests, stagger_s: float) -> RunResult:
    """One request at a time in arrival order; a request arriving while busy waits."""
    start = time.monotonic()
    tokens, latencies = 0, []
    for i, request in enumerate(requests):
        arrival = start + i * stagger_s
        if time.monotonic() < arrival:
            time.sleep(arrival - time.monotonic())
        ids = generator.generate_ids([generator.prompt(request.query, request.documents)],
                                     max_new_tokens=request.max_new_tokens)[0]
        tokens += len(ids)
        latencies.append(time.monotonic() - arrival)
    return RunResult("reference", generator.placement.dtype, len(requests), tokens, time.monotonic() - start,
                     latencies)


def serve(service, requests, stagger_s: float) -> tuple[dict[int, Future], float, list[float]]:
    """Submit at the arrival times and wait for all: (futures, seconds, latencies)."""
    futures, done_at = {}, {}

    def submit(i, request):
        futures[i] = service.submit(request)
        futures[i].add_done_callback(lambda _f, i=i: done_at.__setitem__(i, time.monotonic()))
    start, arrivals = arrive(requests, stagger_s, submit)
    for f in futures.values():
        f.result()
    return futures, max(done_at.values()) - start, [done_at[i] - arrivals[i] for i in sorted(futures)]


def run_static(generator: Generator, requests, stagger_s: float, max_batch: int, max_wait_ms: float) -> RunResult:
    def batch_fn(items):
        # One generate call runs until its longest answer ends; shorter ones are cut
        # where their eos would have been (their rows computed padding meanwhile).
        rows = generator.generate_ids([generator.prompt(r.query, r.documents) for r in items],
                                      max_new_tokens=max(r.max_new_tokens for r in items))
        return [row[:r.max_new_tokens] for row, r in zip(rows, items)]
    service = BatchingService("generate-static", batch_fn, max_size=max_batch, max_wait_ms=max_wait_ms)
    futures, seconds, latencies = serve(service, requests, stagger_s)
    tokens = sum(len(f.result()) for f in futures.values())
    service.close()
    return RunResult("static", generator.placement.dtype, len(requests), tokens, seconds, latencies)


def run_continuous(generator: Generator, requests, stagger_s: float, max_batch: int,
                   prefill_chunk: int) -> tuple[RunResult, ContinuousGenerationService]:
    engine = ContinuousEngine(generator, max_seqs=max_batch, max_tokens=max_batch * 1024, prefill_chunk=prefill_chunk)
    service = ContinuousGenerationService("generate", engine, max_queue=len(requests) + 1)
    _futures, seconds, latencies = serve(service, requests, stagger_s)
    result = RunResult("continuous", generator.placement.dtype, len(requests), service.stats().tokens_generated_total,
                       seconds, latencies, service.ttft_seconds(), service.ttft_seconds(since_admission=True))
    service.close()
    return result, service


def measure_step_times(generator: Generator, requests, max_batch: int) -> dict:
    """Prefill of one prompt alone, and a decode step at the full batch, for the TTFT bound."""
    engine = ContinuousEngine(generator, max_seqs=max_batch, max_tokens=max_batch * 1024, prefill_chunk=100_000)
    for request in requests[:max_batch]:
        engine.add(request)
    started = time.perf_counter()
    engine.step()  # prefills all (one chunk budget covers them) + the first decode step
    prefill_all = time.perf_counter() - started
    steps = []
    for _ in range(5):
        started = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - started)
    one = ContinuousEngine(generator, max_seqs=1, max_tokens=4096, prefill_chunk=100_000)
    seq = one.add(requests[0])
    started = time.perf_counter()
    import torch
    with torch.inference_mode():
        one.scheduler.plan()
        one.runner.prefill_chunk(seq, 0, seq.prompt_len)
    return {"decode_step_s": statistics.median(steps), "prefill_one_s": time.perf_counter() - started,
            "prefill_batch_plus_step_s": prefill_all}


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.bench_generate", __doc__)
    p.add_argument("--requests", type=int, default=16, help="generation requests, arriving --stagger apart")
    p.add_argument("--stagger", type=float, default=1.0, help="seconds between arrivals")
    p.add_argument("--max-batch", type=int, default=8, help="sequences decoding together (continuous and static)")
    p.add_argument("--max-wait-ms", type=float, default=20.0, help="static batching window")
    p.add_argument("--prefill-chunk", type=int, default=512, help="continuous: prompt tokens prefilled per iteration")
    p.add_argument("--answer-lengths", type=parse_answer_lengths, default=(spec.MAX_NEW_TOKENS,) * 2,
                   metavar="N|uniform:LOW:HIGH",
                   help="new tokens per answer (LOW,HIGH; 128 is the target's setting); uniform:LOW:HIGH "
                        "draws a seeded length per request, modelling answers that end at eos")
    p.add_argument("--skip-reference", action="store_true", help="do not run the one-at-a-time reference")
    p.add_argument("--skip-static", action="store_true", help="do not run static batching")
    add_out(p, "bench_generate")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return parser().parse_args(argv)


def run_modes(args: argparse.Namespace, source, placement: Placement, requests) -> tuple[dict, dict[str, RunResult]]:
    """(step times, {mode: result}): continuous, then static and the reference unless skipped."""
    results = {}
    fast = Generator.load(source, placement)
    fast.generate_ids([fast.prompt("warm up", [])], max_new_tokens=2)
    steps = measure_step_times(fast, requests, args.max_batch)
    print(f"[{placement.dtype}] decode step at batch {args.max_batch}: {steps['decode_step_s']*1000:.0f} ms; "
          f"prefill of one prompt: {steps['prefill_one_s']*1000:.0f} ms", flush=True)
    results["continuous"], _ = run_continuous(fast, requests, args.stagger, args.max_batch, args.prefill_chunk)
    print(json.dumps(results["continuous"].summary()), flush=True)
    if not args.skip_static:
        results["static"] = run_static(fast, requests, args.stagger, args.max_batch, args.max_wait_ms)
        print(json.dumps(results["static"].summary()), flush=True)
    del fast
    if not args.skip_reference:
        reference = Generator.load(source, Placement(placement.device, "float32"))
        results["reference"] = run_reference(reference, requests, args.stagger)
        print(json.dumps(results["reference"].summary()), flush=True)
    return steps, results


def build_report(args: argparse.Namespace, source, requests, steps: dict, results: dict[str, RunResult]) -> dict:
    import torch
    cont = results["continuous"]
    bound = 3 * steps["decode_step_s"] + steps["prefill_one_s"]
    report = {
        "settings": {"requests": args.requests, "stagger_s": args.stagger, "max_batch": args.max_batch,
                     "answer_lengths": list(args.answer_lengths),
                     "answer_tokens": [r.max_new_tokens for r in requests],
                     "torch_threads": torch.get_num_threads(), "model_source": source.describe()},
        "step_times": steps, "results": [r.summary() for r in results.values()],
        "ttft_bound_s": bound,
        "ttft_after_admission_p95_within_bound": cont.summary()["ttft_after_admission_p95_s"] <= bound,
    }
    for mode in ("static", "reference"):
        if mode in results:
            report[f"ratio_continuous_vs_{mode}"] = cont.tokens_per_s / results[mode].tokens_per_s
    return report


def print_report(report: dict, results: dict[str, RunResult]) -> None:
    print("\n| mode | dtype | tokens/s | latency p50 / p95 (s) | TTFT from submit p50 / p95 (s) "
          "| TTFT from admission p50 / p95 (s) |\n|---|---|---|---|---|---|")
    for r in results.values():
        s = r.summary()
        ttft = f"{s['ttft_p50_s']} / {s['ttft_p95_s']}" if s["ttft_p50_s"] is not None else "n/a"
        admitted = (f"{s['ttft_after_admission_p50_s']} / {s['ttft_after_admission_p95_s']}"
                    if s["ttft_after_admission_p50_s"] is not None else "n/a")
        print(f"| {s['mode']} | {s['dtype']} | {s['tokens_per_s']} | {s['latency_p50_s']} / {s['latency_p95_s']} "
              f"| {ttft} | {admitted} |")
    if "ratio_continuous_vs_static" in report:
        print(f"\ncontinuous / static tokens/s: {report['ratio_continuous_vs_static']:.2f}x (target >= 1.3x)")
    if "ratio_continuous_vs_reference" in report:
        print(f"continuous / reference tokens/s: {report['ratio_continuous_vs_reference']:.2f}x (target >= 3x)")
    cont = results["continuous"].summary()
    print(f"TTFT after admission p95 {cont['ttft_after_admission_p95_s']} s vs bound 3 decode steps + "
          f"own prefill = {report['ttft_bound_s']:.3f} s (from submit, queueing for a slot included: "
          f"p95 {cont['ttft_p95_s']} s)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings, source = worker_settings()
    requests = make_requests(args.requests, args.answer_lengths)
    steps, results = run_modes(args, source, placement_for(settings, "generate"), requests)
    report = build_report(args, source, requests, steps, results)
    print_report(report, results)
    report["provenance"] = local_record()
    path = write_json(run_folder("bench_generate", args.out) / "bench_generate.json", report)
    print(f"results in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
