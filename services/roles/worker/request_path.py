"""A worker node's request path: embed -> search (node 2) -> fetch -> rerank -> generate ->
sentiment and toxicity at once, every stage on its own thread behind its own stage service (a
pipeline), while the caller's thread waits on futures with the request's deadline.

A request reads one data version end to end: it takes a hold on the current version before its
search, the search names that version to the index nodes, the fetch reads that version's documents,
and the reply says which version answered (`data_version`) and which documents it was given (`sources`).
"""
from __future__ import annotations

import secrets
import threading
import time
from concurrent.futures import CancelledError, Future, wait
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping, Sequence

import faiss
import numpy as np

from pipeline import spec
from pipeline.classifiers import ModerationText
from pipeline.config import BatchConfig
from pipeline.continuous import ContinuousEngine
from pipeline.conversation import HISTORY_TOKENS, fit, retrieval_query
from pipeline.cuda_streams import own_stream_starter
from pipeline.device import thread_budget
from pipeline.docstore import Document, DocumentStore
from pipeline.generator import GenerationRequest
from pipeline.openmp_workers import hand_back_openmp_workers
from pipeline.reranker import RerankRequest
from pipeline.sampling_params import MAX_SEED
from pipeline.spec import Stage
from pipeline.stages import Stages
from services.cluster.sharded_index import ShardedIndexClient
from services.roles.caches import LruCache
from services.roles.versioned_data import VersionedData
from services.roles.worker.answer_pieces import AnswerPieces
from services.roles.worker.stage_clock import StageClock, StageVisit
from services.server import stage_spans
from services.server.answer import AnswerStream, FinalAnswer, Usage
from services.server.answer_request import AnswerRequest
from services.server.deadline import Deadline
from services.server.errors import (
    Overloaded,
    RequestTimeout,
    ServiceClosed,
    ShardUnavailable,
    StageDown,
    StageFailed,
)
from services.server.request_ids import current_request_id
from services.stages.batching import BatchingService
from services.stages.continuous import ContinuousGenerationService
from services.stages.protocol import StageService, StageStats
from services.stages.token_stream import TokenStream
from services.stages.upstream import Upstream


@dataclass(frozen=True)
class ContinuousConfig:
    """The continuous-batching engine's bounds (GENERATE_MAX_BATCH, _KV_CACHE_TOKENS, _PREFILL_CHUNK)."""
    max_batch: int
    kv_cache_tokens: int
    prefill_chunk: int
    max_queue: int


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker reads of the settings, and nothing else."""
    batching: Mapping[Stage, BatchConfig]  # one per stage in spec.WORKER_STAGES but generate
    embed_cache_size: int
    continuous: ContinuousConfig  # the generate stage's
    history_tokens: int = HISTORY_TOKENS  # MAX_HISTORY_TOKENS: a conversation's share of the prompt
    faiss_threads: int = 0  # FAISS_THREADS: the search stage's (a centroid router's quantizer search); 0 = every core


def _in_turn(*calls: Callable[[], None] | None) -> Callable[[], None]:
    """One call that makes each of `calls` (None: nothing) in turn."""
    def run() -> None:
        for call in calls:
            if call is not None:
                call()
    return run


@dataclass(frozen=True)
class PendingSearch:
    """An embedding on its way to node 2, with the deadline of the request it belongs to."""
    vector: np.ndarray
    deadline: float
    request_id: str = ""  # sent to node 2 with its batch, to follow the request there
    trace_context: Any = None  # the request's search span (tracing on): node 2's call joins its trace
    version: str | None = None  # the data version the request reads


@dataclass(frozen=True)
class PendingFetch:
    """A request's search result to fetch, from its data version's documents."""
    store: DocumentStore
    ids: tuple[int, ...]


class Worker:
    def __init__(self, config: WorkerConfig, stages: Stages, index: ShardedIndexClient,
                 documents: VersionedData[DocumentStore]):
        self.config = config
        self.stages = stages
        self.index = index
        self.documents = documents
        self._served = 0
        self._holding = 0  # requests between their arrival here and their answer's end
        self._lock = threading.Lock()
        self.embed_cache = LruCache("embedding", config.embed_cache_size)
        self.upstream = Upstream()  # a batch nobody else in flight may join closes at once
        batch_fns: dict[Stage, Callable[[list], list]] = {
            Stage.EMBED: stages.embedder,
            Stage.SEARCH: self._search_batch,
            Stage.FETCH: self._fetch_batch,
            Stage.RERANK: stages.reranker.rerank,
            Stage.SENTIMENT: stages.sentiment.classify,
            Stage.TOXICITY: stages.toxicity.classify,
        }
        c = config.continuous
        engine = ContinuousEngine(stages.generator, max_batch=c.max_batch, kv_cache_tokens=c.kv_cache_tokens,
                                  prefill_chunk=c.prefill_chunk)
        stages.warm_up(engine)  # before the generate service's thread owns the engine
        self.services: dict[Stage, StageService] = {}
        on_start = own_stream_starter(stages.generator.placement.device)  # every stage's thread, as on_idle
        # faiss's wheel carries its own OpenMP runtime, whose thread count is per thread and not torch's.
        faiss_threads = partial(faiss.omp_set_num_threads, thread_budget(config.faiss_threads))
        for stage in spec.WORKER_STAGES:
            if stage == Stage.GENERATE:
                self.services[stage] = self._generation = ContinuousGenerationService(
                    stage, engine, max_queue=c.max_queue, on_idle=hand_back_openmp_workers, on_start=on_start)
                continue
            cfg = config.batching[stage]  # each batch tells its requests' stage spans its size and start (tracing on)
            self.services[stage] = BatchingService(
                stage, stage_spans.noting_batches(batch_fns[stage]), max_size=cfg.max_batch, max_wait_ms=cfg.max_wait_ms,
                max_queue=cfg.max_queue, upstream=self.upstream, on_idle=hand_back_openmp_workers,
                on_start=_in_turn(on_start, faiss_threads) if stage == Stage.SEARCH else on_start)

    def _search_batch(self, items: list[PendingSearch]) -> list[list[int]]:
        # One HTTP call per index shard and data version in the batch, retried until its latest deadline.
        results: list[list[int]] = [[] for _ in items]
        for rows in _grouped(items, lambda item: item.version).values():
            group = [items[row] for row in rows]
            ids, _ = self.index.search(np.stack([item.vector for item in group]), spec.TOP_K,
                                       deadline=max(item.deadline for item in group),
                                       request_ids=[item.request_id for item in group if item.request_id],
                                       trace_parents=[item.trace_context for item in group], version=group[0].version)
            for row, found in zip(rows, ids):
                results[row] = found
        return results

    @staticmethod
    def _fetch_batch(items: list[PendingFetch]) -> list[list[Document]]:
        # One SQL query per data version in the batch.
        results: list[list[Document]] = [[] for _ in items]
        for rows in _grouped(items, lambda item: id(item.store)).values():
            fetched = items[rows[0]].store.fetch_batch([items[row].ids for row in rows])
            for row, documents in zip(rows, fetched):
                results[row] = documents
        return results

    @staticmethod
    def _wait(stage: str, future: Future, deadline: float):
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:  # our deadline, or a stage that gave up at it (search retries)
            future.cancel()  # skipped by its stage if it has not started yet
            raise RequestTimeout("request timed out") from None
        except (Overloaded, ServiceClosed, CancelledError, ShardUnavailable):
            raise
        except Exception as exc:
            raise StageFailed(stage, exc) from exc

    def answer(self, request: AnswerRequest, deadline: Deadline, first_piece_only: bool = False) -> AnswerStream:
        """The answer in pieces as the LLM produces them (never half a character, nor the start of a stop
        string; each with its tokens' log probabilities where asked; a tool call's name and arguments as
        they are generated), then the final answer (services/server/answer.py), all from the sequence's
        output processor. Closing the stream early cancels the generation. `first_piece_only`: the caller
        reads the first piece and the final answer alone (a gateway's caller that collects the reply)."""
        clock, trace = self._begin(request.request_id, spec.WORKER_STAGES)
        generation: StageVisit | None = None
        with self._lock:
            self._holding += 1
        try:
            generator = self.stages.generator
            fitted = fit(request.conversation, generator.count_tokens, self.config.history_tokens)
            conversation = fitted.conversation or None
            searched = retrieval_query(request.query, fitted.conversation.history)
            version, documents = self._retrieve(clock, trace, searched, deadline)
            tokens = TokenStream()
            sampling = request.sampling(drawn_seed=secrets.randbelow(MAX_SEED + 1))
            prompt = tuple(generator.prompt_ids(request.query, documents, conversation))  # the engine's and usage's
            logprobs: list = []  # each token's, where asked: there before the token reaches `tokens`
            generating = GenerationRequest(request.query, documents, request.max_new_tokens, sampling,
                                           conversation=conversation, on_token=tokens.put, prompt_ids=prompt,
                                           logprobs=logprobs)
            generation = self._enter(clock, Stage.GENERATE, generating)
            tokens.end_with(generation.future)
            # At a stop string the output processor ends the sequence in the engine.
            output = generator.output(request.stop, abort=partial(self._generation.stop, generation.future),
                                      tools_offered=bool(request.tools),
                                      max_calls=None if request.parallel_tool_calls else 1)
            pieces = AnswerPieces(generator.tokens, logprobs if request.logprobs is not None else None)
            # Nothing to end on early and no piece to send (read whole), or only the first (a gateway's collecting
            # caller): the tokens after it are read once the generation ends, one wake-up and not one a token.
            quiet = not (request.stop or request.tools) and (first_piece_only or not request.stream)
            read = tokens.read(deadline)
            if quiet and request.stream:  # the first piece as soon as it is ready
                for token in read:
                    first = list(pieces.of(output, output.push(token)))
                    yield from first
                    if first:
                        break
            if quiet:
                wait([generation.future], deadline.left())
            for token in read:
                yield from pieces.of(output, output.push(token))
            yield from pieces.of(output, output.finish(clock.wait(generation, deadline)), last=True)
            labels = self._classify(clock, request.request_id, output.text, deadline)
            yield FinalAnswer(
                request_id=request.request_id, generated_response=output.text, sentiment=labels["sentiment"],
                is_toxic=labels["is_toxic"], finish_reason=output.finish_reason,
                usage=Usage(len(prompt), output.token_count), tool_calls=tuple(output.tool_calls),
                # The answer's tokens': none past the one that completed a stop string.
                logprobs=None if request.logprobs is None else pieces.given,
                data_version=version, sources=tuple(document.as_source() for document in documents),
                history_turns_dropped=fitted.dropped if request.history else None,
                seed=sampling.seed if sampling is not None and not sampling.greedy else None)
        finally:
            if generation is not None:
                generation.future.cancel()  # a no-op once it ended; frees the slot of a reader gone early
            clock.close()
            with self._lock:
                self._holding -= 1
        with self._lock:
            self._served += 1

    def count_query_tokens(self, query: str) -> int:
        """The query's length in the LLM tokenizer's tokens (MAX_QUERY_TOKENS bounds it)."""
        return self.stages.generator.count_tokens(query)

    def embed(self, texts: Sequence[str], deadline: Deadline) -> list[np.ndarray]:
        """The texts' query embeddings (unit-norm float32, as a query's), each an item of the embed stage,
        batched with the queries'."""
        return self._items(Stage.EMBED, texts, deadline, "embeddings")

    def rerank(self, query: str, documents: Sequence[str], deadline: Deadline) -> list[float]:
        """Each document's reranker score (the model's logit) for `query`, in the documents' order: one
        item of the rerank stage, batched with the queries' (/v1/rerank)."""
        item = RerankRequest(query, tuple(Document(i, "", text, "") for i, text in enumerate(documents)))
        ranked = self._items(Stage.RERANK, [item], deadline, "rerank")[0]
        scores = [0.0] * len(documents)
        for scored in ranked:
            scores[scored.document.doc_id] = scored.score
        return scores

    def moderate(self, texts: Sequence[str], deadline: Deadline) -> list[dict[str, float]]:
        """Each text's toxicity label probabilities, each an item of the toxicity stage, batched with the
        answers' (/v1/moderations)."""
        return self._items(Stage.TOXICITY, [ModerationText(text) for text in texts], deadline, "moderations")

    def _items(self, stage: Stage, items: Sequence, deadline: Deadline, label: str) -> list:
        """The stage's results for `items`, queued at once; an early close or a failure takes back those not started."""
        clock, _trace = self._begin(current_request_id.get() or label, (stage,))
        visits: list[StageVisit] = []
        try:
            for item in items:
                visits.append(self._enter(clock, stage, item))
            return [clock.wait(visit, deadline) for visit in visits]
        finally:
            for visit in visits:
                visit.future.cancel()  # a no-op once it ran
            clock.close()

    def _begin(self, request_id: str, route: Sequence[Stage]) -> tuple[StageClock, str]:
        """The request's clock, on `route`'s stages, and trace id; StageDown at once if a stage is down."""
        for stage, svc in self.services.items():
            if svc.failure is not None:
                raise StageDown(stage, svc.failure)
        trace = current_request_id.get() or request_id
        return StageClock.for_this_thread(trace, self._wait, self.upstream.begin(route)), trace

    def _enter(self, clock: StageClock, stage: Stage, item) -> StageVisit:
        return clock.enter(stage).submit(self.services[stage], item)

    def _retrieve(self, clock: StageClock, trace: str, query: str, deadline: float) -> tuple[str, tuple]:
        """The data version read and the documents for `query` (the retrieval query) from it, reranked, best
        first: embed, search, fetch (one version: held from before the search until the fetch ends), rerank."""
        def run(stage: Stage, item):
            return clock.wait(self._enter(clock, stage, item), deadline)

        vector = self.embed_cache.get(query)
        if vector is None:
            vector = run(Stage.EMBED, query)
            self.embed_cache.put(query, vector)
        data = self.documents.acquire()
        try:
            search = clock.enter(Stage.SEARCH)  # its span's context goes along: node 2's call joins its trace
            item = PendingSearch(vector, deadline, trace, search.span.context if search.span is not None else None,
                                 data.version)
            ids = clock.wait(search.submit(self.services[Stage.SEARCH], item), deadline)
            documents = run(Stage.FETCH, PendingFetch(data.value, tuple(ids)))
        finally:
            data.release()
        ranked = run(Stage.RERANK, RerankRequest(query, tuple(documents)))
        return data.version, tuple(r.document for r in ranked)

    def _classify(self, clock: StageClock, request_id: str, response: str, deadline: float) -> dict:
        """The answer with its sentiment and toxicity."""
        # Sentiment and toxicity depend only on the answer: both are queued before either is awaited.
        sentiment = self._enter(clock, Stage.SENTIMENT, response)
        toxicity = self._enter(clock, Stage.TOXICITY, response)
        try:
            return spec.answer_json(request_id, response, clock.wait(sentiment, deadline),
                                    clock.wait(toxicity, deadline))
        finally:
            toxicity.future.cancel()  # a no-op once it ran; spares the stage if sentiment gave up first

    @property
    def served(self) -> int:
        with self._lock:
            return self._served

    @property
    def holding(self) -> int:
        """Requests in progress here, queued for a stage or running in one: the autoscaler's concurrency."""
        with self._lock:
            return self._holding

    def stats(self) -> dict[Stage, StageStats]:
        return {stage: svc.stats() for stage, svc in self.services.items()}

    def close(self, timeout: float | None = None) -> None:
        for svc in self.services.values():
            svc.close(timeout)
        self.index.close()


def _grouped(items: list, key: Callable[[Any], object]) -> dict[object, list[int]]:
    """The positions of `items` by key, in order of first appearance."""
    groups: dict[object, list[int]] = {}
    for row, item in enumerate(items):
        groups.setdefault(key(item), []).append(row)
    return groups
