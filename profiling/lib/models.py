"""A measuring tool's models as a worker would run them: settings from the environment, torch on the worker's thread
budget (TORCH_THREADS), the configured model source (stand-ins built if that is what it names and they are missing:
a tool may build them, a serving node may not); the memory they take; and each worker stage's batch function with
realistic inputs per batch size (what profiling.microbench times)."""
from __future__ import annotations

import argparse
import gc
import logging
import re
import resource
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from builders.standins import source_building_standins
from pipeline import spec
from pipeline.config import Settings
from pipeline.device import Placement, placement_for, thread_budget
from pipeline.generator import GenerationRequest, Generator
from pipeline.models import ModelSource
from profiling.lib import inputs

log = logging.getLogger(__name__)


def worker_settings() -> tuple[Settings, ModelSource]:
    """The environment's settings and model source, torch set to the threads a worker gives its models."""
    import torch
    settings = Settings.from_env()
    torch.set_num_threads(thread_budget(settings.models.torch_threads))
    return settings, source_building_standins(settings)


def worker_generator() -> tuple[Generator, ModelSource, Placement]:
    """The LLM placed as the service places it (device, dtype, precision), and where it came from."""
    settings, source = worker_settings()
    placement = placement_for(settings, "generate")
    return Generator.load(source, placement), source, placement


def model_class(stage: str) -> type:
    """The pipeline class that loads a model stage's model."""
    from pipeline.classifiers import SentimentClassifier, ToxicityClassifier
    from pipeline.embedder import Embedder
    from pipeline.reranker import Reranker
    return {"embed": Embedder, "rerank": Reranker, "generate": Generator, "sentiment": SentimentClassifier,
            "toxicity": ToxicityClassifier}[stage]


class MemoryProbe:
    """Peak and current RSS of this process.

    ru_maxrss only ever grows, so with `--stage all` every stage would report the
    largest model loaded before it. Linux can reset the peak (VmHWM) by writing 5
    to /proc/self/clear_refs; where that is refused we fall back to ru_maxrss and
    say so once."""

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
        try:
            status = Path("/proc/self/status").read_text() if self.resettable else ""
        except OSError:
            status = ""
        match = re.search(r"^VmHWM:\s+(\d+)\s+kB", status, re.MULTILINE)
        hwm_kib = int(match.group(1)) if match else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        return hwm_kib / 1024

    @staticmethod
    def current_mib() -> float:
        import psutil
        return psutil.Process().memory_info().rss / 2**20


@dataclass
class StageBench:
    """A stage's batch function, how to make a batch of inputs, and what it runs on."""
    name: str
    run: Callable[[list], Any]
    make_inputs: Callable[[int, int], Any]  # (batch_size, round) -> inputs
    device: str
    dtype: str
    threads: int
    model_source: str
    details: dict = field(default_factory=dict)
    model: Any = None  # the stage's model (profiling.lib.kernel_baselines switches its kernels); None: no model

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.details.items())


class BenchContext:
    """What every stage builder needs, each part made once, on first use."""

    def __init__(self, settings: Settings, args: argparse.Namespace):
        self.settings, self.args = settings, args

    @cached_property
    def source(self) -> ModelSource:
        return source_building_standins(self.settings)

    @cached_property
    def pool(self) -> list:
        return inputs.document_pool(self.args.documents)

    @cached_property
    def articles(self) -> list:
        """Support articles, whatever --documents says: the classifiers read answers,
        and the course rows (~95 characters) are far shorter than an answer."""
        return inputs.document_pool(None)

    def model_bench(self, stage: str, run: Callable[[Any], Callable[[list], Any]],
                    make_inputs: Callable[[Any], Callable[[int, int], Any]], details: dict) -> StageBench:
        """The stage's model placed as a worker places it; `run` and `make_inputs` are given the model."""
        placement = placement_for(self.settings, stage)
        model = model_class(stage).load(self.source, placement)
        return StageBench(stage, run(model), make_inputs(model), placement.device, placement.dtype,
                          thread_budget(self.settings.models.torch_threads), self.source.describe(), details,
                          getattr(model, "model", None))


def build_embed(ctx: BenchContext) -> StageBench:
    return ctx.model_bench("embed", lambda m: m.embed, lambda m: inputs.spec_queries,
                           {"inputs": "spec-queries"})


def build_search(ctx: BenchContext) -> StageBench:
    import faiss

    from pipeline.vector_index import VectorIndex
    index = VectorIndex.load(ctx.args.index or ctx.settings.index.faiss_index_path, nprobe=ctx.settings.index.nprobe,
                             mmap=ctx.settings.index.faiss_mmap)
    threads = thread_budget(ctx.settings.index.faiss_threads)
    faiss.omp_set_num_threads(threads)
    vectors = search_vectors(ctx, index.dim)

    def make_inputs(n: int, r: int) -> np.ndarray:
        return np.ascontiguousarray(inputs.cycled(vectors, n, r * n)) if vectors is not None \
            else inputs.random_unit_vectors(n, index.dim, inputs.SEED + 1000 * n + r)

    return StageBench("search", lambda x: index.search(x, spec.TOP_K), make_inputs, "cpu", "float32", threads,
                      "none", {"k": spec.TOP_K, "nprobe": index.nprobe, "nlist": index.nlist,
                               "ntotal": index.ntotal, "mmap": index.is_mmap, "vectors": ctx.args.search_vectors})


def search_vectors(ctx: BenchContext, dim: int) -> np.ndarray | None:
    """The SPEC queries embedded by the configured embedder (None: random unit vectors).

    Embedded queries probe the lists real traffic probes (it matters on the
    support index); on the course index, filled with random vectors, either is fine."""
    if ctx.args.search_vectors != "embedded":
        return None
    embedder = model_class("embed").load(ctx.source, placement_for(ctx.settings, "embed"))
    vectors = embedder.embed(list(spec.REFERENCE_QUERIES))
    del embedder
    gc.collect()
    if vectors.shape[1] != dim:
        raise ValueError(f"embedder gives {vectors.shape[1]}-d vectors, the index holds {dim}-d")
    return vectors


def build_fetch(ctx: BenchContext) -> StageBench:
    from pipeline.docstore import DocumentStore
    store = DocumentStore(ctx.args.documents or ctx.settings.fetch.documents_dir)
    top = inputs.max_doc_id(store.path)

    def make_inputs(n: int, r: int) -> list[list[int]]:
        # Fresh ids every round: the same ids again would only measure SQLite's page cache.
        return inputs.random_id_lists(n, top, inputs.SEED + 1000 * n + r)

    return StageBench("fetch", store.fetch_batch, make_inputs, "cpu", "-", 1, "none",
                      {"ids_per_item": spec.TOP_K, "max_doc_id": top})


def build_rerank(ctx: BenchContext) -> StageBench:
    pool = ctx.pool
    return ctx.model_bench("rerank", lambda m: m.rerank, lambda m: lambda n, r: inputs.rerank_inputs(pool, n, r),
                           {"docs_per_item": inputs.DOCS_PER_RERANK,
                            "mean_doc_chars": round(statistics.mean(len(d.content) for d in pool)),
                            "docs": "db" if ctx.args.documents else "corpus"})


def decode_full_length(engine) -> None:
    """No sequence of `engine` stops at EOS, as decode benchmarks run: random-weight stand-ins may emit
    it at any step; every answer then decodes its whole budget, comparable across models and variants."""
    engine.scheduler.eos_ids = frozenset()


def bench_engine(generator: Generator, max_batch: int, prompts: list[list[int]], max_new_tokens: int, *,
                 prefill_chunk: int, full_length: bool = True):
    """The continuous engine the service runs, sized for `max_batch` of `prompts` with `max_new_tokens`
    each, warmed as a worker warms it (on CUDA: every decode-step graph recorded). full_length:
    decode_full_length (every answer max_new_tokens long: the worst case)."""
    from pipeline.continuous import ContinuousEngine
    from pipeline.continuous.slots import chunks_for
    longest = chunks_for(max(len(p) for p in prompts) + max_new_tokens)
    engine = ContinuousEngine(generator, max_batch=max_batch, kv_cache_tokens=max_batch * longest,
                              prefill_chunk=prefill_chunk)
    if full_length:
        decode_full_length(engine)
    engine.warm_up([GenerationRequest("", (), 2, prompt_ids=tuple(prompts[0]))])
    return engine


def engine_generate_ids(engine, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Each prompt's new token ids from `engine` (all added at once, run until every one ends)."""
    seqs = [engine.add(GenerationRequest("", (), max_new_tokens, prompt_ids=tuple(p))) for p in prompts]
    while engine.has_work():
        failed = engine.step().failed
        if failed:
            raise RuntimeError(f"generation failed: {failed[0][1]!r}") from failed[0][1]
    return [list(seq.generated) for seq in seqs]


def build_generate(ctx: BenchContext) -> StageBench:
    """The LLM through the continuous engine, a batch being that many sequences added at once."""
    max_new = ctx.args.max_new_tokens
    details: dict[str, Any] = {"max_new_tokens": max_new, "decoder": "continuous engine"}
    engine: dict[str, Any] = {}  # made with the prompts, which are made with the model

    def make_inputs(generator) -> Callable[[int, int], list]:
        prompts = inputs.generation_prompts(generator, spec.REFERENCE_QUERIES, ctx.pool)
        details.update(prompt_tokens=round(statistics.mean(len(p) for p in prompts)), out_tokens="?")
        engine["engine"] = bench_engine(generator, max(ctx.args.batch_sizes), prompts, max_new,
                                        prefill_chunk=ctx.settings.generate.prefill_chunk,
                                        full_length=not ctx.args.allow_early_stop)
        return lambda n, r: inputs.cycled(prompts, n, r)

    def run(batch: list) -> list[list[int]]:
        ids = engine_generate_ids(engine["engine"], batch, max_new)
        details["out_tokens"] = round(float(statistics.mean(len(row) for row in ids)), 1)
        return ids

    return ctx.model_bench("generate", lambda m: run, make_inputs, details)


def build_classifier(stage: str) -> Callable[[BenchContext], StageBench]:
    def build(ctx: BenchContext) -> StageBench:
        articles = ctx.articles
        return ctx.model_bench(stage, lambda m: m.classify, lambda m: lambda n, r: inputs.answer_texts(articles, n, r),
                               {"text_chars": f"{inputs.ANSWER_CHARS[0]}-{inputs.ANSWER_CHARS[1]}"})
    return build


BUILDERS: Mapping[str, Callable[[BenchContext], StageBench]] = {
    "embed": build_embed, "search": build_search, "fetch": build_fetch, "rerank": build_rerank,
    "generate": build_generate, "sentiment": build_classifier("sentiment"), "toxicity": build_classifier("toxicity"),
}
