"""A worker's request path over the tiny stand-ins, node 2 searched in-process."""
from __future__ import annotations

import pytest

from pipeline.config import Settings
from pipeline.docstore import DocumentStore
from pipeline.stages import Stages
from pipeline.vector_index import VectorIndex
from services.roles.worker.request_path import Worker
from services.roles.worker.role import worker_config
from services.server.answer_request import AnswerRequest
from services.server.stream_response import collect


class InProcessIndex:
    """What a worker asks of node 2 (ShardedIndexClient.search), answered by the index itself."""

    def __init__(self, index: VectorIndex):
        self.index = index

    def search(self, vectors, k, **_context):
        ids, distances = self.index.search(vectors, k)
        return ids.tolist(), distances.tolist()

    def close(self) -> None:
        pass


@pytest.fixture
def worker(support_data, embedder, reranker, generator, sentiment, toxicity):
    stages = Stages(embedder=embedder, store=DocumentStore(support_data.db_path), reranker=reranker,
                    generator=generator, sentiment=sentiment, toxicity=toxicity)
    index = InProcessIndex(VectorIndex.load(support_data.index_path, nprobe=64))
    worker = Worker(worker_config(Settings.from_env({})), stages, index)
    yield worker
    worker.close(timeout=30)


def test_a_request_encodes_its_prompt_once_and_its_usage_counts_those_ids(worker, generator, monkeypatch):
    encoded: list[list[int]] = []
    encode = generator.tokens.prompt_ids

    def counting(query, documents):
        encoded.append(encode(query, documents))
        return encoded[-1]

    monkeypatch.setattr(generator.tokens, "prompt_ids", counting)
    request = AnswerRequest("once-1", "How do I return an item?", max_new_tokens=4)
    reply = collect(worker.answer(request, timeout_s=120))
    assert len(encoded) == 1  # the engine's prompt and the reply's usage share one encoding
    assert reply["usage"] == {"prompt_tokens": len(encoded[0]), "completion_tokens": 4}
    assert reply["finish_reason"] == "length"


def test_the_concurrency_gauge_counts_a_request_from_its_arrival_to_its_answers_end(worker):
    from services.roles.worker.metrics import CONCURRENCY_METRIC, WorkerCollector

    def gauge() -> float:
        (family,) = [f for f in WorkerCollector(lambda: worker).collect() if f.name == CONCURRENCY_METRIC]
        return family.samples[0].value

    assert gauge() == 0
    stream = worker.answer(AnswerRequest("held-1", "Where is my order?", max_new_tokens=4), timeout_s=120)
    first = next(stream)  # the first piece: the request is in the generate stage now
    assert first and gauge() == 1
    rest = list(stream)
    assert isinstance(rest[-1], dict) and gauge() == 0
    closed_early = worker.answer(AnswerRequest("held-2", "Where is my order?", max_new_tokens=4), timeout_s=120)
    next(closed_early)
    closed_early.close()  # a caller gone early: no longer held
    assert gauge() == 0
    assert list(WorkerCollector(lambda: None).collect()) == []
