"""Each worker stage's batch function loaded the way a worker loads it, with realistic inputs per batch
size: what profiling.microbench times."""
from __future__ import annotations

import argparse
import gc
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from pipeline import spec
from pipeline.config import Settings
from pipeline.device import placement_for, thread_budget
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
            from builders.standins import source_building_standins
            self._source = source_building_standins(self.settings)
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
    prompts = [generator.prompt_ids(q, cycled(pool, spec.CONTEXT_DOCS, i * spec.CONTEXT_DOCS))
               for i, q in enumerate(spec.REFERENCE_QUERIES)]
    prompt_tokens = statistics.mean(len(p) for p in prompts)
    details = {"max_new_tokens": max_new, "prompt_tokens": round(prompt_tokens), "out_tokens": "?"}
    count_new_tokens(generator, details)
    return StageBench("generate", lambda batch: generator.generate_ids(batch, max_new_tokens=max_new),
                      lambda n, r: cycled(prompts, n, r), placement.device, placement.dtype,
                      torch_threads(ctx.settings), ctx.source.describe(), details)


def count_new_tokens(generator, details: dict) -> None:
    """Record the mean number of tokens each sequence really generated in details["out_tokens"].

    generate_ids trims each answer at its end of sequence, so this wraps this instance's model.generate to read the
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
