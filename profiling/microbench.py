"""Microbenchmarks: each pipeline stage's batch function timed in-process, by batch size.

    python -m profiling.microbench --stage {embed,search,fetch,rerank,generate,sentiment,toxicity,all}
        --batch-sizes 1,2,4,8,16,32 [--repeat 5] [--warmup 1] [--out DIR]
        [--index PATH] [--documents DIR] [--max-new-tokens 128] [--search-vectors embedded|random]

No HTTP, queues or threads of the service: this is what a stage costs once its
BatchingService has formed a batch, i.e. the numbers to choose *_MAX_BATCH by.
Stages load the way the workers load them (MODEL_SOURCE, STANDIN_PROFILE, DTYPE
and the per-stage *_DTYPE, ONLY_CPU, TORCH_THREADS / FAISS_THREADS), so
`STANDIN_PROFILE=faithful MODEL_SOURCE=standin` gives the real models' timings offline.

Inputs are realistic for each stage (see the `*_inputs` functions). Every batch
size gets its own warm-up: a new input shape costs one-off work (oneDNN
primitives, allocator growth, cold index pages) that is not the steady state.

Writes microbench_<stage>.csv (one row per batch size), microbench_<stage>.png
and microbench_settings.json (the git commit and the settings this process ran
with) into --out, or a fresh runs/microbench-<UTC time>/ folder, and prints a
summary table.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import re
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from tqdm import tqdm

from pipeline import spec
from pipeline.config import ConfigError, Settings
from pipeline.device import placement_for, thread_budget
from pipeline.docstore import DocumentStoreError
from pipeline.vector_index import VectorIndexError
from profiling.lib.cli import add_out, comma_list, make_parser, positive
from profiling.lib.inputs import (
    ANSWER_CHARS,
    DOCS_PER_RERANK,
    SEED,
    answer_texts,
    cycled,
    document_pool,
    max_doc_id,
    random_id_lists,
    random_unit_vectors,
    rerank_inputs,
    spec_queries,
)
from profiling.lib.provenance import local_record
from profiling.lib.report import run_folder, write_csv, write_json

log = logging.getLogger("profiling.microbench")

STAGES = tuple(map(str, spec.WORKER_STAGES))  # plain names: argparse shows choices with repr()


# ------------------------------------------------------------------------- results

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

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


def summarize(stage: "StageBench", batch_size: int, times: Sequence[float], repeat: int, warmup: int,
              memory: "MemoryProbe") -> BenchRow:
    median, lo, hi = statistics.median(times), min(times), max(times)
    return BenchRow(
        stage=stage.name, batch_size=batch_size, repeat=repeat, warmup=warmup,
        batch_s_median=median, batch_s_min=lo, batch_s_max=hi,
        item_s_median=median / batch_size, item_s_min=lo / batch_size, item_s_max=hi / batch_size,
        items_per_s=batch_size / median if median > 0 else float("inf"),
        peak_rss_mib=memory.peak_mib(), rss_mib=memory.current_mib(),
        dtype=stage.dtype, device=stage.device, threads=stage.threads, model_source=stage.model_source,
        detail=stage.describe(),
    )


# ------------------------------------------------------------------------- memory

class MemoryProbe:
    """Peak and current RSS of this process.

    ru_maxrss only ever grows, so with `--stage all` every stage would report the
    largest model loaded before it. Linux can reset the peak (VmHWM) by writing 5
    to /proc/self/clear_refs; where that is refused we fall back to ru_maxrss and
    say so once.
    """

    def __init__(self):
        self.resettable = self.reset()
        if not self.resettable:
            log.info("cannot reset the peak RSS here; peaks are since the process started")

    @staticmethod
    def reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def peak_mib(self) -> float:
        hwm_kib = _status_kib("VmHWM") if self.resettable else None
        if hwm_kib is None:
            hwm_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        return hwm_kib / 1024

    @staticmethod
    def current_mib() -> float:
        import psutil
        return psutil.Process().memory_info().rss / 2**20


def _status_kib(key: str) -> int | None:
    try:
        match = re.search(rf"^{key}:\s+(\d+)\s+kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


# ------------------------------------------------------------------------- stages

@dataclass
class StageBench:
    """A stage's batch function, how to make a batch of inputs, and what it runs on."""
    name: str
    run: Callable[[list], Any]
    make_inputs: Callable[[int, int], list]  # (batch_size, round) -> inputs
    device: str
    dtype: str
    threads: int
    model_source: str
    details: dict = field(default_factory=dict)

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.details.items())


@dataclass
class BenchContext:
    """What every stage builder needs; the model source is resolved once, on first use."""
    settings: Settings
    args: argparse.Namespace
    _source: Any = field(default=None, init=False, repr=False)
    _pool: list | None = field(default=None, init=False, repr=False)
    _articles: list | None = field(default=None, init=False, repr=False)

    @property
    def source(self):
        if self._source is None:
            from pipeline.models import resolve_model_source
            self._source = resolve_model_source(self.settings)
        return self._source

    @property
    def pool(self) -> list:
        if self._pool is None:
            self._pool = document_pool(self.args.documents)
        return self._pool

    @property
    def articles(self) -> list:
        """Support articles, whatever --documents says: the classifiers read answers,
        and the course rows (~95 characters) are far shorter than an answer."""
        if self._articles is None:
            self._articles = document_pool(None)
        return self._articles

    def documents_dir(self) -> Path:
        return self.args.documents or self.settings.fetch.documents_dir

    def index_path(self) -> Path:
        return self.args.index or self.settings.index.faiss_index_path

    def model_bench(self, stage: str, model_cls, run_name: str, make_inputs, **details) -> StageBench:
        placement = placement_for(self.settings, stage)
        model = model_cls.load(self.source, placement)
        return StageBench(stage, getattr(model, run_name), make_inputs, placement.device, placement.dtype,
                          torch_threads(self.settings), self.source.describe(), dict(details))


def torch_threads(settings: Settings) -> int:
    return thread_budget(settings.models.torch_threads)


def build_embed(ctx: BenchContext) -> StageBench:
    from pipeline.embedder import Embedder
    return ctx.model_bench("embed", Embedder, "embed", lambda n, r: spec_queries(n, r), inputs="spec-queries")


def build_search(ctx: BenchContext) -> StageBench:
    import faiss

    from pipeline.vector_index import VectorIndex
    index = VectorIndex.load(ctx.index_path(), nprobe=ctx.settings.index.nprobe, mmap=ctx.settings.index.faiss_mmap)
    threads = thread_budget(ctx.settings.index.faiss_threads)
    faiss.omp_set_num_threads(threads)
    vectors = search_vectors(ctx, index.dim)

    def make_inputs(n: int, r: int) -> np.ndarray:
        return np.ascontiguousarray(cycled(vectors, n, r * n)) if vectors is not None \
            else random_unit_vectors(n, index.dim, SEED + 1000 * n + r)

    return StageBench("search", lambda x: index.search(x, spec.TOP_K), make_inputs, "cpu", "float32", threads,
                      "none", {"k": spec.TOP_K, "nprobe": index.nprobe, "nlist": index.nlist,
                               "ntotal": index.ntotal, "mmap": index.is_mmap,
                               "vectors": ctx.args.search_vectors})


def search_vectors(ctx: BenchContext, dim: int) -> np.ndarray | None:
    """The SPEC queries embedded by the configured embedder (None: random unit vectors).

    Embedded queries probe the lists real traffic probes (it matters on the
    support index); on the course index, filled with random vectors, either is fine.
    """
    if ctx.args.search_vectors != "embedded":
        return None
    from pipeline.embedder import Embedder
    embedder = Embedder.load(ctx.source, placement_for(ctx.settings, "embed"))
    vectors = embedder.embed(list(spec.REFERENCE_QUERIES))
    del embedder
    gc.collect()
    if vectors.shape[1] != dim:
        raise ValueError(f"embedder gives {vectors.shape[1]}-d vectors, the index holds {dim}-d")
    return vectors


def build_fetch(ctx: BenchContext) -> StageBench:
    from pipeline.docstore import DocumentStore
    store = DocumentStore(ctx.documents_dir())
    top = max_doc_id(store.path)
    # Fresh ids every round: the same ids again would only measure SQLite's page cache.
    return StageBench("fetch", store.fetch_batch, lambda n, r: random_id_lists(n, top, SEED + 1000 * n + r),
                      "cpu", "-", 1, "none", {"ids_per_item": spec.TOP_K, "max_doc_id": top})


def build_rerank(ctx: BenchContext) -> StageBench:
    from pipeline.reranker import Reranker
    pool = ctx.pool
    chars = statistics.mean(len(d.content) for d in pool)
    return ctx.model_bench("rerank", Reranker, "rerank", lambda n, r: rerank_inputs(pool, n, r),
                           docs_per_item=DOCS_PER_RERANK, mean_doc_chars=round(chars),
                           docs="db" if ctx.args.documents else "corpus")


def build_generate(ctx: BenchContext) -> StageBench:
    from pipeline.generator import Generator
    max_new = ctx.args.max_new_tokens
    placement = placement_for(ctx.settings, "generate")
    generator = Generator.load(ctx.source, placement)
    if not ctx.args.allow_early_stop:
        # Random-weight stand-ins may emit EOS at any step; forcing the full
        # count makes runs comparable across models and dtypes (the worst case).
        generator.generation_config.min_new_tokens = max_new
    pool = ctx.pool
    prompts = [generator.prompt(q, cycled(pool, spec.CONTEXT_DOCS, i * spec.CONTEXT_DOCS))
               for i, q in enumerate(spec.REFERENCE_QUERIES)]
    prompt_tokens = statistics.mean(len(generator.tokenizer(p).input_ids) for p in prompts)
    details = {"max_new_tokens": max_new, "prompt_tokens": round(prompt_tokens), "out_tokens": "?"}
    count_new_tokens(generator, details)
    return StageBench("generate", lambda batch: generator.generate_prompts(batch, max_new_tokens=max_new),
                      lambda n, r: cycled(prompts, n, r), placement.device, placement.dtype,
                      torch_threads(ctx.settings), ctx.source.describe(), details)


def count_new_tokens(generator, details: dict) -> None:
    """Record the mean number of tokens each sequence really generated in details["out_tokens"].

    generate_prompts returns only text, and re-tokenising decoded text does not
    give the count back, so this wraps this instance's model.generate to read the
    output ids: new tokens other than padding (finished sequences are padded).
    """
    model, inner = generator.model, generator.model.generate
    pad = generator.generation_config.pad_token_id

    def generate(*args, **kwargs):
        output = inner(*args, **kwargs)
        new = output[:, kwargs["input_ids"].shape[1]:]
        counts = (new != pad).sum(dim=1) if pad is not None else new.new_full((new.shape[0],), new.shape[1])
        details["out_tokens"] = round(counts.float().mean().item(), 1)
        return output

    model.generate = generate


def build_classifier(stage: str) -> Callable[[BenchContext], StageBench]:
    def build(ctx: BenchContext) -> StageBench:
        from pipeline.classifiers import SentimentClassifier, ToxicityClassifier
        cls = SentimentClassifier if stage == "sentiment" else ToxicityClassifier
        articles = ctx.articles
        return ctx.model_bench(stage, cls, "classify", lambda n, r: answer_texts(articles, n, r),
                               text_chars=f"{ANSWER_CHARS[0]}-{ANSWER_CHARS[1]}")
    return build


BUILDERS: Mapping[str, Callable[[BenchContext], StageBench]] = {
    "embed": build_embed, "search": build_search, "fetch": build_fetch, "rerank": build_rerank,
    "generate": build_generate, "sentiment": build_classifier("sentiment"),
    "toxicity": build_classifier("toxicity"),
}


# ------------------------------------------------------------------------- running

def time_batch(bench: StageBench, inputs: list) -> float:
    started = time.perf_counter()
    bench.run(inputs)
    return time.perf_counter() - started


def bench_stage(bench: StageBench, batch_sizes: Sequence[int], repeat: int, warmup: int,
                memory: MemoryProbe, progress: bool = True) -> list[BenchRow]:
    rows = []
    with tqdm(total=len(batch_sizes) * (repeat + warmup), desc=bench.name, unit="batch",
              disable=not progress, file=sys.stderr) as bar:
        for batch_size in batch_sizes:
            for w in range(warmup):
                # Negative rounds: warm-up inputs differ from the timed ones.
                time_batch(bench, bench.make_inputs(batch_size, -1 - w))
                bar.update()
            times = []
            for r in range(repeat):
                times.append(time_batch(bench, bench.make_inputs(batch_size, r)))
                bar.update()
            rows.append(summarize(bench, batch_size, times, repeat, warmup, memory))
    return rows


def write_plot(path: Path, rows: Sequence[BenchRow]) -> Path:
    from profiling.lib.plots import microbench_plot
    first = rows[0]
    subtitle = (f"{first.model_source} {first.device}/{first.dtype} threads={first.threads} "
                f"repeat={first.repeat} {first.detail}")
    return microbench_plot(path, first.stage, [r.batch_size for r in rows],
                           [r.item_s_median * 1e3 for r in rows], [r.item_s_min * 1e3 for r in rows],
                           [r.item_s_max * 1e3 for r in rows], [r.items_per_s for r in rows], subtitle)


def format_table(rows: Sequence[BenchRow]) -> str:
    header = (f"{'stage':<10}{'batch':>6}{'batch med s':>13}{'min s':>10}{'max s':>10}{'item med ms':>13}"
              f"{'items/s':>10}{'peak MiB':>10}  dtype     threads  source")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.stage:<10}{r.batch_size:>6}{r.batch_s_median:>13.4f}{r.batch_s_min:>10.4f}"
                     f"{r.batch_s_max:>10.4f}{r.item_s_median * 1e3:>13.2f}{r.items_per_s:>10.1f}"
                     f"{r.peak_rss_mib:>10.0f}  {r.dtype:<9} {r.threads:>7}  {r.model_source}")
    return "\n".join(lines)


@dataclass(frozen=True)
class StageResult:
    stage: str
    rows: list[BenchRow]
    csv_path: Path
    png_path: Path


def run_stage(ctx: BenchContext, stage: str, memory: MemoryProbe, progress: bool) -> StageResult:
    memory.reset()  # this stage's peak: its model, inputs and activations only
    bench = BUILDERS[stage](ctx)
    args = ctx.args
    rows = bench_stage(bench, args.batch_sizes, args.repeat, args.warmup, memory, progress)
    out = Path(args.out)
    result = StageResult(stage, rows, write_csv(out / f"microbench_{stage}.csv", rows, BenchRow.columns()),
                         write_plot(out / f"microbench_{stage}.png", rows))
    del bench  # free the model before the next stage loads its own
    gc.collect()
    return result


# ------------------------------------------------------------------------- CLI

parse_batch_sizes = comma_list(int, minimum=1, sort_unique=True, what="batch sizes", example="1,2,4,8")


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.microbench", __doc__)
    p.add_argument("--stage", required=True, choices=STAGES + ("all",), help="the stage to time, or all")
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
    torch.set_num_threads(torch_threads(settings))  # the same budget a worker gives its models
    args.out = run_folder("microbench", args.out)
    write_json(args.out / "microbench_settings.json", {"args": vars(args), "provenance": local_record(env)})
    ctx = BenchContext(settings, args)
    memory = MemoryProbe()
    stages = STAGES if args.stage == "all" else (args.stage,)
    results = []
    for stage in stages:
        try:
            results.append(run_stage(ctx, stage, memory, progress=not args.no_progress))
        except (ConfigError, OSError, DocumentStoreError, VectorIndexError) as exc:
            print(f"{stage}: cannot run: {exc}", file=sys.stderr)
            return 2
    print(format_table([row for r in results for row in r.rows]))
    for r in results:
        print(f"{r.stage}: {r.rows[0].detail}\n  wrote {r.csv_path} and {r.png_path}")
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
