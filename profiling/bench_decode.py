"""Where a continuous-batching decode step's time goes, at 1 and more sequences, and how far it is from the memory floor.

    python -m profiling.bench_decode [--sequences 1,16] [--repeat 8] [--profile]
                                     [--precisions bfloat16,int8-dynamic,int4-weight]
                                     [--baselines unfused-int8,chunked-attention] [--out runs/bench_decode]

Fills the continuous engine with N running sequences (the SPEC prompt over support documents, ~250 tokens
each), then times engine steps that are pure decode (no prefill in the plan). Each step is split into: model
forward, token choice (repetition penalty + argmax), the runner's other decode work (ids, positions, mask, cache
and seen-token bookkeeping) and the engine's own Python (plan, update, release). `--profile` adds torch.profiler's
top operators by self CPU time over a few steps (with their device time on CUDA), each profile's chrome trace
beside the report (trace_<precision>_<runner>_<sequences>.json). To compare commits, run each tree in turn (the
runner and the attention kernel change together). `--baselines` also measures, interleaved the same way on the same model,
kernels switched back to their baselines (profiling/lib/kernel_baselines.py names each and whether it gives the
same bits). The model and precision come from the environment (MODEL_SOURCE, STANDIN_PROFILE, PRECISION or
GENERATE_PRECISION, TORCH_THREADS); `--precisions` loads the LLM in each variant named instead, one after the other.

Every step is printed against its floor (profiling/lib/decode_floor.py): the bytes it must read (every Linear
weight once, the KV cache of its sequences) over the read bandwidth, a streaming read of a buffer of
`--bandwidth-mib` measured here first (at one thread and at torch's thread count, the step's; on a GPU in the
device's memory, which its steps read) and again between every round of steps: the fastest read of either, per
precision (printed beside its floor: a shared host's bandwidth moves), and the step against the floor at the
median read between its rounds too. The step is also
split where the gap lies: its products (every op multiplying by a weight, profiling/lib/engine_step.py's
PRODUCT_OPS: one step's recorded, then replayed alone, best of a few) against the weights' floor alone, and the
rest (attention, norms, rotary, token choice, the engine). Beside the memory's floor, the products' arithmetic
floor: their multiply-adds, counted as recorded, at the peak rate of each kernel's instruction measured here
(profiling/lib/arithmetic_peaks.py; the project's kernels only), and the step against the larger of the two.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import spec
from pipeline.config import PRECISION_VARIANTS, Settings
from pipeline.continuous import ContinuousEngine
from pipeline.device import placement_for
from pipeline.generator import GenerationRequest, Generator
from profiling.lib import arithmetic_peaks, decode_floor
from profiling.lib.cli import add_out, choice_list, comma_list, make_parser, positive
from profiling.lib.engine_step import ProductRecorder, profiled_steps
from profiling.lib.inputs import cycled, document_pool, spec_queries
from profiling.lib.kernel_baselines import BASELINES, running
from profiling.lib.models import decode_full_length, worker_generator, worker_settings
from profiling.lib.provenance import local_record
from profiling.lib.report import run_folder, write_json

PHASES = ("forward", "choose", "decode_other", "engine_other")
PRODUCT_REPLAYS = 5  # replays of one step's products; the best is its products' time
CURRENT = "current"


# ------------------------------------------------------------------------- timing one step by phase

class _Timed:
    """Wraps a callable; adds each call's seconds to phases[name]."""

    def __init__(self, fn, phases: dict[str, float], name: str):
        self._fn, self._phases, self._name = fn, phases, name

    def __call__(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self._fn(*args, **kwargs)
        finally:
            self._phases[self._name] += time.perf_counter() - started

    def __getattr__(self, attr):  # the runner reads model attributes (config, device)
        return getattr(self._fn, attr)


def instrument(engine: ContinuousEngine) -> dict[str, float]:
    """Time the runner's model calls, token choice and decode; returns the live accumulator."""
    phases = dict.fromkeys(("forward", "choose", "decode"), 0.0)
    runner = engine.runner
    runner.model = _Timed(runner.model, phases, "forward")
    runner._choose = _Timed(runner._choose, phases, "choose")
    runner.decode = _Timed(runner.decode, phases, "decode")
    return phases


def timed_step(engine: ContinuousEngine, phases: dict[str, float]) -> dict[str, float]:
    """One pure-decode engine step, split into PHASES (seconds)."""
    for name in phases:
        phases[name] = 0.0
    started = time.perf_counter()
    result = engine.step()
    total = time.perf_counter() - started
    if result.failed or result.finished:
        raise RuntimeError("a sequence failed or finished during the timed steps: too many steps for 128 tokens?")
    return {"total": total, "forward": phases["forward"], "choose": phases["choose"],
            "decode_other": phases["decode"] - phases["forward"] - phases["choose"],
            "engine_other": total - phases["decode"]}


# ------------------------------------------------------------------------- engines

def requests(n: int) -> list[GenerationRequest]:
    """n SPEC prompts (reference queries over three support documents each): ~250 tokens."""
    pool = document_pool(None)
    return [GenerationRequest(query, tuple(cycled(pool, 3, 3 * i))) for i, query in enumerate(spec_queries(n))]


def filled_engine(generator: Generator, n: int) -> ContinuousEngine:
    """An engine warmed as a worker warms it (on CUDA: every decode-step graph recorded), then holding n
    running sequences, all prompts prefilled, ready for pure decode steps."""
    engine = ContinuousEngine(generator, max_batch=n, kv_cache_tokens=n * 2048, prefill_chunk=4096)
    decode_full_length(engine)  # the batch stays n wide through the timed steps
    batch = requests(n)
    engine.warm_up([GenerationRequest(batch[0].query, batch[0].documents, 2)])
    for request in batch:
        engine.add(request)
    while len(engine.scheduler.running) < n:
        engine.step()
    engine.step()  # the first step with every row decoding: first-use costs stay out of the timed steps
    return engine


@dataclass
class Variant:
    name: str
    engine: ContinuousEngine
    phases: dict[str, float]
    baseline: str | None = None  # profiling.lib.kernel_baselines' name; None: the current kernels
    steps: list[dict[str, float]] = field(default_factory=list)
    products_ms: float | None = None
    product_macs: dict[str, int] | None = None  # per product op, one step's

    def kernels(self):
        """Within: the model runs this variant's kernels."""
        return running(self.engine.generator.model, self.baseline)


def build_variants(generator: Generator, n: int, baselines: list[str]) -> list[Variant]:
    variants = []
    for baseline in [*baselines, None]:
        with running(generator.model, baseline):
            engine = filled_engine(generator, n)
        variants.append(Variant(f"{CURRENT} {baseline}" if baseline else CURRENT, engine, instrument(engine), baseline))
    return variants


# ------------------------------------------------------------------------- measuring

def measure(variants: list[Variant], repeat: int, probe: decode_floor.BandwidthProbe) -> None:
    """repeat steps per variant, interleaved (the order flips each round: both see the same cache growth), the
    memory's read bandwidth sampled after each round."""
    for round_ in range(repeat):
        for variant in (variants if round_ % 2 == 0 else variants[::-1]):
            with variant.kernels():
                variant.steps.append(timed_step(variant.engine, variant.phases))
        probe.sample()


def time_products(variant: Variant) -> None:
    """One more step with its products recorded, then replayed alone: the step's time in its products.
    Half a GB of weights and more does not stay in cache between replays, so each reads them as the step does.
    On the CPU only: a GPU runs them asynchronously (and as CUDA graphs, which dispatch no op to record)."""
    import torch
    if variant.engine.runner.table.device != "cpu":
        return
    recorder = ProductRecorder()
    with variant.kernels():  # the replay too: a baseline may hold its weights elsewhere
        with recorder.mode:
            timed_step(variant.engine, variant.phases)
        with torch.inference_mode():
            variant.products_ms, variant.product_macs = recorder.replay_ms(PRODUCT_REPLAYS, 1), dict(recorder.macs)


def summary(variant: Variant, n: int) -> dict:
    medians = {key: statistics.median(step[key] for step in variant.steps) for key in ("total", *PHASES)}
    tokens = [list(s.generated) for s in variant.engine.scheduler.running]
    return {"runner": variant.name, "sequences": n, "steps": len(variant.steps),
            "step_ms": round(1000 * medians["total"], 2),
            "step_ms_min": round(1000 * min(step["total"] for step in variant.steps), 2),
            "phases_ms": {key: round(1000 * medians[key], 2) for key in PHASES},
            # four significant figures: a tiny model's products take hundredths of a millisecond
            "products_ms": None if variant.products_ms is None else float(f"{variant.products_ms:.4g}"),
            "product_macs": variant.product_macs,
            "longest_row": max(row.length for row in variant.engine.runner.table.rows),
            "context_tokens": sum(row.length for row in variant.engine.runner.table.rows), "tokens": tokens,
            "cuda_graphs": None if variant.engine.runner.graphs is None else variant.engine.runner.graphs.recorded}


def profile_steps(variant: Variant, steps: int, top: int, trace: Path) -> dict:
    """torch.profiler over a few steps (the device's kernels too on CUDA): the top operators by self CPU time; the
    chrome trace written to `trace`."""
    with variant.kernels():
        found = profiled_steps(lambda: timed_step(variant.engine, variant.phases), steps, trace,
                               variant.engine.runner.table.device != "cpu")
    total = sum(op["self_ms_per_step"] for op in found["ops"]) or 1
    rows = [{**op, "share": round(op["self_ms_per_step"] / total, 3)} for op in found["ops"][:top]]
    return {"runner": variant.name, "steps": steps, "top_ops": rows, "trace": found["trace"]}


# ------------------------------------------------------------------------- report

def format_rows(rows: list[dict]) -> str:
    header = f"{'runner':<27}{'seqs':>5}{'step ms':>10}{'min ms':>9}" + "".join(f"{p:>14}" for p in PHASES)
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(f"{row['runner'][:26]:<27}{row['sequences']:>5}{row['step_ms']:>10.1f}{row['step_ms_min']:>9.1f}"
                     + "".join(f"{row['phases_ms'][p]:>14.1f}" for p in PHASES))
    return "\n".join(lines)


def format_profile(prof: dict, n: int) -> str:
    lines = [f"top ops by self CPU, {prof['runner']} at {n} sequences (per step over {prof['steps']} steps):",
             f"  {'op':<44}{'calls':>7}{'ms/step':>10}{'device ms':>11}{'share':>8}"]
    lines += [f"  {r['op'][:43]:<44}{r['calls']:>7}{r['self_ms_per_step']:>10.2f}{r['device_ms_per_step']:>11.2f}{r['share']:>8.1%}"
              for r in prof["top_ops"]]
    return "\n".join(lines)


def same_tokens(rows: list[dict]) -> bool:
    """Whether the runners whose kernels give the current bits chose the same tokens (others' may differ)."""
    kept = [r for r in rows if BASELINES.get(r["runner"].removeprefix(f"{CURRENT} "), True)]
    return len({str(r["tokens"]) for r in kept}) == 1


def ratios(rows: list[dict]) -> dict[str, float]:
    """Per runner: step at the most sequences / step at the fewest."""
    out = {}
    for name in dict.fromkeys(r["runner"] for r in rows):
        mine = sorted((r for r in rows if r["runner"] == name), key=lambda r: r["sequences"])
        if len(mine) > 1:
            out[f"{name}: {mine[-1]['sequences']} vs {mine[0]['sequences']}"] = round(mine[-1]["step_ms"] / mine[0]["step_ms"], 2)
    return out


# ------------------------------------------------------------------------- CLI

def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.bench_decode", __doc__)
    p.add_argument("--sequences", type=comma_list(int, minimum=1, sort_unique=True, example="1,16"),
                   default=[1, 16], help="running sequences per measured batch")
    p.add_argument("--repeat", type=positive(int), default=8, help="timed decode steps per runner and size")
    p.add_argument("--profile", action="store_true", help="torch.profiler top operators per size")
    p.add_argument("--profile-steps", type=positive(int), default=3, help="decode steps --profile records")
    p.add_argument("--top", type=positive(int), default=15, help="operators listed by --profile")
    p.add_argument("--precisions", type=choice_list(PRECISION_VARIANTS, "precisions", "bfloat16,int4-weight"), default=None,
                   help="load the LLM in each of these variants in turn; unset: as GENERATE_PRECISION or PRECISION places it")
    p.add_argument("--bandwidth-mib", type=positive(int), default=1024,
                   help="MiB of the buffer read to measure the memory bandwidth (many times the last-level cache)")
    p.add_argument("--baselines", type=choice_list(tuple(BASELINES), "baselines", "chunked-attention"), default=[],
                   help=f"also measure, interleaved, kernels switched back to these baselines: {', '.join(BASELINES)}")
    add_out(p, "bench_decode")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    steps = args.repeat + (args.profile_steps if args.profile else 0)
    if steps + 3 > spec.MAX_NEW_TOKENS:
        p.error(f"--repeat + --profile-steps must leave room within {spec.MAX_NEW_TOKENS} new tokens")
    return args


def run_size(generator: Generator, n: int, args: argparse.Namespace,
             probe: decode_floor.BandwidthProbe) -> tuple[list, list]:
    variants = build_variants(generator, n, args.baselines)
    measure(variants, args.repeat, probe)
    for variant in variants:
        time_products(variant)
    rows = [summary(v, n) for v in variants]
    if not same_tokens(rows):
        print(f"WARNING: runners of the same bits chose different tokens at {n} sequences", flush=True)
    precision = generator.placement.precision
    profiles = [profile_steps(v, args.profile_steps, args.top, args.out / f"trace_{precision}_{v.name.replace(' ', '_')}_{n}.json")
                for v in variants] if args.profile else []
    for prof in profiles:
        print(format_profile(prof, n), flush=True)
    return rows, profiles


def load_generator(precision: str | None) -> tuple[Generator, object, object]:
    """The LLM as a worker places it, in `precision` where given (refused as the service refuses it)."""
    if precision is None:
        return worker_generator()
    _, source = worker_settings()
    placement = placement_for(Settings.from_env({**os.environ, "GENERATE_PRECISION": precision}), "generate")
    return Generator.load(source, placement), source, placement


def run_precision(precision: str | None, args: argparse.Namespace, bandwidth: dict[str, float],
                  rates: dict[str, float]) -> dict:
    import torch
    generator, source, placement = load_generator(precision)
    rows, profiles, same = [], {}, {}
    probe = decode_floor.BandwidthProbe(args.bandwidth_mib, placement.device)
    for n in args.sequences:
        size_rows, profiles[str(n)] = run_size(generator, n, args, probe)
        same[str(n)] = same_tokens(size_rows)
        rows += size_rows
    floor_bandwidth = max(bandwidth[decode_floor.bandwidth_key(placement.device)], probe.fastest() or 0.0)
    median_bandwidth = probe.median() or floor_bandwidth
    decode_floor.add_floors(rows, generator.model, floor_bandwidth, rates)
    for row in rows:
        row["precision"] = placement.precision
        row["floor_gb_s"], row["median_gb_s"] = round(floor_bandwidth / 1e9, 2), round(median_bandwidth / 1e9, 2)
        # the step against the floor at the bandwidth its rounds typically had (not a floor: reads vary)
        row["step_over_median_floor"] = round(row["step_over_floor"] * median_bandwidth / floor_bandwidth, 2)
    print(f"\n[{placement.precision}, {torch.get_num_threads()} threads, {source.describe()}] median per step:")
    print(format_rows(rows))
    report = {"settings": {"sequences": args.sequences, "repeat": args.repeat, "dtype": placement.dtype,
                           "torch_threads": torch.get_num_threads(), "model_source": source.describe(),
                           "baselines": args.baselines, "precision": placement.precision},
              "bandwidth_gb_s": {k: round(v / 1e9, 2) for k, v in bandwidth.items()},
              "ratio_most_vs_fewest": ratios(rows), "same_tokens_across_runners": same,
              "rows": rows, "profiles": profiles}
    print("step ratio:", report["ratio_most_vs_fewest"])
    report["provenance"] = local_record()
    path = write_json(run_folder("bench_decode", args.out) / f"bench_decode_{placement.precision}.json", report)
    print(f"results in {path}")
    del generator, probe
    gc.collect()
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings, _ = worker_settings()  # torch on the worker's threads before the bandwidth is read at that count
    args.out = run_folder("bench_decode", args.out)  # one folder for every precision's file
    bandwidth = decode_floor.measure_bandwidths(args.bandwidth_mib, placement_for(settings, "generate").device)
    import torch
    print("read bandwidth: " + decode_floor.format_bandwidths(bandwidth))
    rates = arithmetic_peaks.product_rates(torch.get_num_threads())
    print("peak multiply-adds: " + (", ".join(f"{op} {v / 1e9:.0f} GMAC/s" for op, v in rates.items()) or "none measured"))
    reports = [run_precision(p, args, bandwidth, rates) for p in (args.precisions or [None])]
    rows = [r for report in reports for r in report["rows"] if r["runner"] == CURRENT]
    print("\neach step against its memory floor (weights + KV cache read / read bandwidth) and its products' arithmetic:")
    print(decode_floor.format_floor_rows(rows))
    floors = {"bandwidth_gb_s": reports[0]["bandwidth_gb_s"], "bandwidth_mib": args.bandwidth_mib,
              "mac_rates_gmac_s": {op: round(v / 1e9, 1) for op, v in rates.items()},
              "rows": [{k: r[k] for k in decode_floor.TABLE_KEYS} for r in rows],
              "provenance": local_record()}
    path = write_json(args.out / "bench_decode_floor.json", floors)
    print(f"floor table in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
