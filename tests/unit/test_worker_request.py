"""A worker's request path over the tiny stand-ins, node 2 searched in-process."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import Settings
from pipeline.docstore import DocumentStore
from pipeline.reranker import RerankRequest
from pipeline.spec import Stage
from pipeline.stages import Stages
from pipeline.vector_index import VectorIndex
from services.roles.versioned_data import VersionedData
from services.roles.worker.request_path import Worker
from services.roles.worker.role import worker_config
from services.server.answer_request import AnswerRequest
from services.server.deadline import Deadline
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
    documents = VersionedData(support_data.db_path.parent, lambda directory, _: DocumentStore(directory / "documents"),
                              DocumentStore.close)
    documents.load_startup()
    worker = Worker(worker_config(Settings.from_env({})), stages, index, documents)
    yield worker
    worker.close(timeout=30)
    documents.close()


def test_a_reply_names_its_data_version_and_the_documents_it_was_given(worker, support_data, reference):
    request = AnswerRequest("version-1", "How do I return an item?", max_new_tokens=4)
    reply = collect(worker.answer(request, Deadline.after(120)))
    assert reply["data_version"] == support_data.version == support_data.index_path.parent.name
    query = "How do I return an item?"
    ranked = reference.reranker.rerank([RerankRequest(query, tuple(reference.retrieve(query)))])[0]
    assert reply["sources"] == [scored.document.doc_id for scored in ranked]


def test_a_request_encodes_its_prompt_once_and_its_usage_counts_those_ids(worker, generator, monkeypatch):
    encoded: list[list[int]] = []
    encode = generator.tokens.prompt_ids

    def counting(query, documents):
        encoded.append(encode(query, documents))
        return encoded[-1]

    monkeypatch.setattr(generator.tokens, "prompt_ids", counting)
    request = AnswerRequest("once-1", "How do I return an item?", max_new_tokens=4)
    reply = collect(worker.answer(request, Deadline.after(120)))
    assert len(encoded) == 1  # the engine's prompt and the reply's usage share one encoding
    assert reply["usage"] == {"prompt_tokens": len(encoded[0]), "completion_tokens": 4}
    assert reply["finish_reason"] == "length"


def test_embed_gives_the_query_embedders_vectors_through_the_embed_stage_and_times_it(worker, embedder):
    from services.roles.worker.stage_clock import collect_stage_times
    times = collect_stage_times()
    texts = ["How do I return an item?", "refund policy"]
    vectors = worker.embed(texts, Deadline.after(60))
    expected = embedder(texts)
    assert len(vectors) == 2 and all(np.allclose(v, e, atol=1e-5) for v, e in zip(vectors, expected))
    assert worker.stats()[Stage.EMBED].summary()["items"] >= 2 and "embed" in times
