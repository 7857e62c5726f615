"""A worker's batches close at once when no other request in flight may still join them
(services/stages/upstream.py): with ten-second windows on every batched stage, a lone request (an
answer, several embeddings, a rerank, a moderation) is answered in far less than one window, two
at once get their lone answers, and a request still upstream holds a batch until it leaves."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.config import Settings
from pipeline.docstore import DocumentStore
from pipeline.spec import WORKER_STAGES, Stage
from pipeline.stages import Stages
from pipeline.vector_index import VectorIndex
from services.roles.versioned_data import VersionedData
from services.roles.worker.request_path import Worker
from services.roles.worker.role import worker_config
from services.server.answer_request import AnswerRequest
from services.server.deadline import Deadline
from services.server.stream_response import collect
from tests.helpers import InProcessIndex, wait_until

WINDOW_S = 10.0
BATCHED = [stage for stage in WORKER_STAGES if stage != Stage.GENERATE]
LONG_WINDOWS = {f"{stage.upper()}_MAX_WAIT_MS": str(int(WINDOW_S * 1000)) for stage in BATCHED}
FAR_LESS_S = 5.0  # one window would be 10 s; a window at each of six stages, a minute


@pytest.fixture
def worker(support_data, embedder, reranker, generator, sentiment, toxicity):
    stages = Stages(embedder=embedder, reranker=reranker, generator=generator, sentiment=sentiment,
                    toxicity=toxicity)
    documents = VersionedData(support_data.db_path.parent, lambda directory, _: DocumentStore(directory / "documents"),
                              DocumentStore.close)
    documents.load_startup()
    worker = Worker(worker_config(Settings.from_env(LONG_WINDOWS)), stages,
                    InProcessIndex(VectorIndex.load(support_data.index_path, nprobe=64)), documents)
    assert {worker.services[stage].stats().max_wait_ms for stage in BATCHED} == {WINDOW_S * 1000}
    yield worker
    worker.close(timeout=30)
    documents.close()


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def answer(worker: Worker, request_id: str, query: str) -> dict:
    return collect(worker.answer(AnswerRequest(request_id, query, max_new_tokens=4), Deadline.after(120))).wire()


def test_a_lone_request_meets_no_window_at_any_stage(worker):
    reply, elapsed = timed(lambda: answer(worker, "lone-1", "How do I return an item?"))
    assert reply["generated_response"] and reply["sentiment"] and elapsed < FAR_LESS_S
    vectors, elapsed = timed(lambda: worker.embed(["refund policy", "shipping", "warranty"], Deadline.after(60)))
    assert len(vectors) == 3 and elapsed < FAR_LESS_S
    # A request's items are all queued before it counts as in the stage: they share one batch.
    assert worker.stats()[Stage.EMBED].batch_size_counts[3] == 1
    scores, elapsed = timed(lambda: worker.rerank("refunds", ["refunds in 30 days", "shipping"], Deadline.after(60)))
    assert len(scores) == 2 and elapsed < FAR_LESS_S
    labels, elapsed = timed(lambda: worker.moderate(["you are kind"], Deadline.after(60)))
    assert len(labels) == 1 and elapsed < FAR_LESS_S
    assert all(worker.upstream.may_join(stage) == 0 for stage in WORKER_STAGES)  # every request ended


def test_two_requests_at_once_get_their_lone_answers_without_waiting_out_a_window(worker):
    queries = {"pair-1": "How do I return an item?", "pair-2": "What is your refund policy?"}
    alone = {request_id: answer(worker, request_id, query) for request_id, query in queries.items()}
    worker.embed_cache.clear()  # both embed again, this time side by side
    start = threading.Barrier(len(queries))

    def together(item):
        start.wait()
        return item[0], answer(worker, *item)

    started = time.monotonic()
    with ThreadPoolExecutor(len(queries)) as pool:
        replies = dict(pool.map(together, queries.items()))
    assert replies == alone
    assert time.monotonic() - started < FAR_LESS_S  # each batch waited only while the other could still join


def test_a_request_still_upstream_holds_a_batch_until_it_leaves(worker):
    upstream_request = worker.upstream.begin(WORKER_STAGES)  # arrived, not yet at embed
    done = threading.Event()
    vectors: list = []

    def embed() -> None:
        vectors.extend(worker.embed(["refund policy"], Deadline.after(60)))
        done.set()

    thread = threading.Thread(target=embed, daemon=True)
    thread.start()
    try:
        # The embedding is queued and its caller waits on it: only the other request holds the batch.
        wait_until(lambda: worker.stats()[Stage.EMBED].queue_depth == 1 and worker.upstream.may_join(Stage.EMBED) == 1,
                   30, "the embedding was never queued")
        assert not done.is_set()  # the window is ten seconds and someone may still join
    finally:
        upstream_request.end()  # it failed, or skipped ahead: the batch has nobody left to wait for
    assert done.wait(FAR_LESS_S) and len(vectors) == 1
