"""Microbenchmarks: each pipeline stage's batch function timed in-process, by batch size.

No HTTP, queues or threads of the service: this is what a stage costs once its BatchingService has formed a batch,
i.e. the numbers to choose *_MAX_BATCH by. Stages load the way the workers load them (MODEL_SOURCE, STANDIN_PROFILE,
PRECISION and the per-stage *_PRECISION, ONLY_CPU, TORCH_THREADS / FAISS_THREADS), so `STANDIN_PROFILE=faithful
MODEL_SOURCE=standin` gives the real models' timings offline.

Inputs are realistic for each stage (profiling/lib/inputs.py). Every batch size gets its own warm-up: a new input
shape costs one-off work (oneDNN primitives, allocator growth, cold index pages) that is not the steady state.

`--baseline NAME` also times each batch with kernels switched back to a baseline (profiling/lib/kernel_baselines.py:
unfused-int8, chunked-attention), the two interleaved round by round on the same inputs, and prints the ratios.

Writes microbench_<stage>.csv (one row per batch size and kernels), microbench_<stage>.png and microbench_settings.json (the git
commit and the settings this process ran with) into --out, or a fresh runs/microbench-<UTC time>/ folder, and prints
a summary table."""
from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from tqdm import tqdm

from pipeline import spec
from pipeline.config import ConfigError, Settings
from pipeline.docstore import DocumentStoreError
from pipeline.vector_index import VectorIndexError
from profiling.lib.cli import add_out, comma_list, make_parser, positive, stage_list
from profiling.lib.kernel_baselines import BASELINES, running
from profiling.lib.models import BUILDERS, BenchContext, MemoryProbe
from profiling.lib.plots import microbench_plot
from profiling.lib.provenance import local_record
from profiling.lib.report import run_folder, text_table, write_csv, write_json

STAGES = tuple(map(str, spec.WORKER_STAGES))  # plain names: argparse shows choices with repr()
CURRENT = "current"


@dataclass(frozen=True)
class BenchRow:
    """One stage at one batch size; times in seconds, memory in MiB."""
    stage: str
    batch_size: int
    repeat: int
    warmup: int
    batch_s_median: float
    batch_s_min: float
    batch_s_max: float
    item_s_median: float
    item_s_min: float
    item_s_max: float
    items_per_s: float  # batch_size / median batch time
    peak_rss_mib: float  # this stage's peak (reset per stage where the kernel allows)
    rss_mib: float  # resident after this batch size
    dtype: str
    device: str
    threads: int
    model_source: str
    detail: str  # stage-specific facts that explain the numbers (nprobe, tokens, ...)
    kernels: str = CURRENT  # or the baseline's name (profiling.lib.kernel_baselines)

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


def format_table(rows: Sequence[BenchRow]) -> str:
    columns = [("stage", "<10"), ("kernels", "<19"), ("batch", ">6"), ("batch med s", ">13.4f"), ("min s", ">10.4f"),
               ("max s", ">10.4f"), ("item med ms", ">13.2f"), ("items/s", ">10.1f"), ("peak MiB", ">10.0f"),
               ("  dtype", "<11"), ("threads", ">8"), ("  source", "")]
    return text_table(columns, [(r.stage, r.kernels, r.batch_size, r.batch_s_median, r.batch_s_min, r.batch_s_max,
                                 r.item_s_median * 1e3, r.items_per_s, r.peak_rss_mib, "  " + r.dtype, r.threads,
                                 "  " + r.model_source) for r in rows])


def baseline_ratios(rows: Sequence[BenchRow]) -> list[str]:
    """Per stage and batch size where a baseline ran beside the current kernels: its median over the current's."""
    current = {(r.stage, r.batch_size): r for r in rows if r.kernels == CURRENT}
    return [f"{r.stage} batch {r.batch_size}: {r.kernels} / {CURRENT} = "
            f"{r.batch_s_median / current[(r.stage, r.batch_size)].batch_s_median:.2f}"
            for r in rows if r.kernels != CURRENT and (r.stage, r.batch_size) in current]


def run_stage(ctx: BenchContext, stage: str, memory: MemoryProbe, progress: bool) -> list[BenchRow]:
    """One stage timed at each batch size, each with its own warm-up; its CSV and plot written into --out."""
    memory.reset()  # this stage's peak: its model, inputs and activations only
    bench, args, rows = BUILDERS[stage](ctx), ctx.args, []
    with tqdm(total=len(args.batch_sizes) * (args.repeat + args.warmup), desc=stage, unit="batch",
              disable=not progress, file=sys.stderr) as bar:
        for n in args.batch_sizes:
            kernels = [CURRENT] + ([args.baseline] if args.baseline else [])
            times: dict[str, list[float]] = {k: [] for k in kernels}
            for r in range(-args.warmup, args.repeat):  # negative rounds untimed: warm-up inputs differ from timed
                inputs = bench.make_inputs(n, r)
                for k in (kernels if r % 2 == 0 else kernels[::-1]):  # the order flips each round
                    with running(bench.model, None if k == CURRENT else k):
                        started = time.perf_counter()
                        bench.run(inputs)
                        elapsed = time.perf_counter() - started
                    if r >= 0:
                        times[k].append(elapsed)
                bar.update()
            for k, timed in times.items():
                median, lo, hi = statistics.median(timed), min(timed), max(timed)
                rows.append(BenchRow(stage, n, args.repeat, args.warmup, median, lo, hi, median / n, lo / n, hi / n,
                                     n / median if median > 0 else float("inf"), memory.peak_mib(),
                                     memory.current_mib(), bench.dtype, bench.device, bench.threads,
                                     bench.model_source, bench.describe(), k))
    write_csv(args.out / f"microbench_{stage}.csv", rows, BenchRow.columns())
    microbench_plot(args.out / f"microbench_{stage}.png", [r for r in rows if r.kernels == CURRENT])
    del bench  # free the model before the next stage loads its own
    gc.collect()
    return rows


parse_batch_sizes = comma_list(int, minimum=1, sort_unique=True, what="batch sizes", example="1,2,4,8")


def parse_stages(raw: str) -> list[str]:
    return list(STAGES) if raw == "all" else stage_list(STAGES)(raw)


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.microbench", __doc__)
    p.add_argument("--stage", required=True, type=parse_stages,
                   help=f"the stages to time, comma-separated, or all ({','.join(STAGES)})")
    p.add_argument("--batch-sizes", type=parse_batch_sizes, default=[1, 2, 4, 8, 16, 32], help="batch sizes timed")
    p.add_argument("--repeat", type=positive(int), default=5, help="timed runs per batch size")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per batch size first")
    add_out(p, "microbench")
    p.add_argument("--index", type=Path, default=None, help="FAISS index for search; unset: FAISS_INDEX_PATH")
    p.add_argument("--documents", type=Path, default=None,
                   help="folder holding documents.db: fetch reads it (unset: DOCUMENTS_DIR); rerank and "
                        "generate draw documents from it (unset: the support corpus)")
    p.add_argument("--max-new-tokens", type=positive(int), default=spec.MAX_NEW_TOKENS, help="generate: new tokens")
    p.add_argument("--allow-early-stop", action="store_true",
                   help="let generation stop at EOS (off: always decode --max-new-tokens tokens)")
    p.add_argument("--search-vectors", choices=("embedded", "random"), default="embedded",
                   help="search queries: the SPEC queries embedded by the configured embedder, or random unit vectors")
    p.add_argument("--baseline", choices=tuple(BASELINES), default=None,
                   help="also time each batch with kernels switched back to this baseline, interleaved")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env(env)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    import torch

    from pipeline.device import thread_budget
    torch.set_num_threads(thread_budget(settings.models.torch_threads))  # the budget a worker gives its models
    args.out = run_folder("microbench", args.out)
    write_json(args.out / "microbench_settings.json", {"args": vars(args), "provenance": local_record(env)})
    ctx = BenchContext(settings, args)
    memory = MemoryProbe()
    results = {}
    for stage in args.stage:
        try:
            results[stage] = run_stage(ctx, stage, memory, progress=not args.no_progress)
        except (ConfigError, OSError, DocumentStoreError, VectorIndexError) as exc:
            print(f"{stage}: cannot run: {exc}", file=sys.stderr)
            return 2
    every_row = [row for rows in results.values() for row in rows]
    print(format_table(every_row))
    for line in baseline_ratios(every_row):
        print(line)
    for stage, rows in results.items():
        print(f"{stage}: {rows[0].detail}\n  wrote {args.out}/microbench_{stage}.csv and microbench_{stage}.png")
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
