"""Token-budget batching: the queue policy with an injected clock, a stress run of many threads
submitting items of random cost, the reranker's cost of a request, the token metric families
read from a snapshot, and the worker's wiring of the encoder stages' costs."""
from __future__ import annotations

import random
import threading
from types import SimpleNamespace

import pytest

from pipeline import spec
from pipeline.config import BatchConfig
from pipeline.reranker import Reranker, RerankRequest, length_groups
from services.roles.worker.request_path import Worker, WorkerConfig
from services.stages.batch_queue import BatchQueue
from services.stages.batch_stats import TOKEN_BUCKETS
from services.stages.batching import BatchingService
from services.stages.token_policy import BatchTokens, TokenPolicy
from tests.helpers import ManualClock
from tests.unit.test_stage_services import scrape

RESULT_TIMEOUT = 10.0  # seconds; only reached when something is broken


def queue(budget: int | None, tokens: BatchTokens = BatchTokens.PADDED, *, max_size: int = 8,
          max_wait_ms: float = 10) -> tuple[BatchQueue, ManualClock]:
    clock = ManualClock(100.0)
    return BatchQueue("q", max_size=max_size, max_wait_ms=max_wait_ms, max_queue=100,
                      tokens=TokenPolicy(tokens, budget), clock=clock), clock


def taken(q: BatchQueue) -> list:
    return [p.item for p in q.take()]


# ----------------------------------------------------------------------------- the policy


def test_a_batch_closes_when_the_next_item_would_take_its_padded_tokens_over_the_budget():
    q, clock = queue(100)  # padded: items x the longest
    q.put(["a", "b"], costs=[30, 20])  # 2 x 30 = 60
    assert q.due_in() == pytest.approx(0.010)  # within the budget: the window runs
    q.put(["c"], costs=[40])  # 3 x 40 = 120 > 100: a, b are a full batch
    assert q.due_in() == 0
    assert taken(q) == ["a", "b"]
    assert q.due_in() == pytest.approx(0.010)  # c alone: back to its window (it arrived at the same time)
    q.put(["d", "e"], costs=[10, 10])  # c, d: 2 x 40 = 80; with e 3 x 40 = 120
    assert q.due_in() == 0 and taken(q) == ["c", "d"]
    clock.now += 0.010
    assert taken(q) == ["e"]
    st = q.snapshot()
    assert st.batches_total == 3 and st.token_closed_batches_total == 2 and st.over_budget_batches_total == 0
    assert st.tokens_total == 30 + 20 + 40 + 10 + 10 and st.max_batch_tokens_seen == 80
    assert st.counts_tokens and st.max_tokens == 100


def test_the_longest_item_sets_a_padded_batch_but_a_summed_batch_adds_costs():
    padded, _ = queue(100, BatchTokens.PADDED)
    summed, _ = queue(100, BatchTokens.SUMMED)
    for q in (padded, summed):
        q.put(["short", "short", "long"], costs=[10, 10, 45])
    assert taken(padded) == ["short", "short"]  # 3 x 45 = 135 > 100
    assert taken(summed) == ["short", "short", "long"]  # 10 + 10 + 45 = 65
    assert BatchTokens.PADDED.batch_tokens([10, 10, 45]) == 135 and BatchTokens.SUMMED.batch_tokens([10, 10, 45]) == 65


def test_an_item_over_the_budget_runs_alone_and_is_never_starved_or_skipped():
    q, clock = queue(100, BatchTokens.SUMMED)
    q.put(["small"], costs=[10])
    q.put(["huge"], costs=[500])
    q.put(["after"], costs=[10])
    # Arrival order: "after" would fit with "small" but never jumps the huge item.
    assert q.due_in() == 0 and taken(q) == ["small"]
    assert q.due_in() == 0 and taken(q) == ["huge"]  # alone, over the budget, at once (the next cannot join)
    clock.now += 0.010
    assert taken(q) == ["after"]
    st = q.snapshot()
    assert st.over_budget_batches_total == 1 and st.max_batch_tokens_seen == 500
    assert st.token_closed_batches_total == 2 and st.batch_size_counts == {1: 3}


def test_a_lone_item_over_the_budget_waits_for_its_window_like_any_other():
    q, clock = queue(100)
    q.put(["huge"], costs=[500])
    assert q.due_in() == pytest.approx(0.010)  # nothing after it yet: a fuller batch is not possible, nor due
    clock.now += 0.010
    assert taken(q) == ["huge"]


def test_count_still_closes_a_batch_within_the_budget_and_counts_its_tokens():
    q, _ = queue(1000, max_size=2)
    q.put(["a", "b", "c"], costs=[5, 7, 9])
    assert q.due_in() == 0 and taken(q) == ["a", "b"]
    st = q.snapshot()
    assert st.token_closed_batches_total == 0 and st.tokens_total == 12 and st.max_batch_tokens_seen == 14
    # Per item, by TOKEN_BUCKETS bound: both 5 and 7 are at most the first bound.
    assert st.token_bucket_counts[0] == 2 and sum(st.token_bucket_counts) == 2 and TOKEN_BUCKETS[0] >= 7


def test_without_a_budget_tokens_are_counted_and_never_close_a_batch():
    q, clock = queue(None, BatchTokens.SUMMED)
    q.put(["a", "b"], costs=[10_000, 20_000])
    assert q.due_in() == pytest.approx(0.010)
    clock.now += 0.010
    assert taken(q) == ["a", "b"]
    st = q.snapshot()
    assert st.tokens_total == 30_000 and st.max_tokens == 0 and st.over_budget_batches_total == 0


def test_a_cancelled_item_costs_nothing_and_the_budget_is_checked_at_take():
    q, clock = queue(100, BatchTokens.SUMMED)
    first, big = q.put(["first", "big"], costs=[60, 60])
    assert q.due_in() == 0  # 120 > 100
    assert big.cancel()  # gone from the queue at once
    assert q.due_in() == pytest.approx(0.010)
    clock.now += 0.010
    assert taken(q) == ["first"] and not first.done()
    assert q.snapshot().tokens_total == 60


def test_costs_are_required_when_tokens_are_counted_and_must_be_token_counts():
    q, _ = queue(100)
    with pytest.raises(ValueError, match="counts tokens"):
        q.put(["a"])
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="cost must be an int >= 0"):
            q.put(["a"], costs=[bad])
    with pytest.raises(ValueError, match="2 items but 1 costs"):
        q.put(["a", "b"], costs=[1])
    assert len(q) == 0  # nothing was queued by a refused put
    for budget in (0, -5):
        with pytest.raises(ValueError, match="max_tokens"):
            BatchQueue("q", max_size=2, max_wait_ms=0, max_queue=4, tokens=TokenPolicy(BatchTokens.PADDED, budget))
    plain = BatchQueue("q", max_size=2, max_wait_ms=0, max_queue=4)
    plain.put(["a"])  # a stage that does not count tokens needs no cost
    assert not plain.snapshot().counts_tokens


# ----------------------------------------------------------------------------- the service under stress


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tokens", list(BatchTokens))
def test_many_threads_random_costs_every_future_once_and_no_batch_over_budget_unless_alone(tokens):
    budget = 200
    batches: list[list[tuple[int, int, int]]] = []
    lock = threading.Lock()

    def run(items):
        with lock:
            batches.append(list(items))
        return [(thread, seq) for thread, seq, _ in items]

    svc = BatchingService("stress", run, max_size=16, max_wait_ms=1, max_queue=100_000,
                          tokens=TokenPolicy(tokens, budget))
    threads_n, per_thread = 8, 250
    endings: list = []
    costs_sent = [0] * threads_n
    start = threading.Barrier(threads_n)

    def client(thread: int) -> None:
        rng = random.Random(thread)
        start.wait()
        futures = []
        for seq in range(per_thread):
            cost = rng.choice([rng.randint(0, 60), rng.randint(0, 60), rng.randint(150, 400)])  # some over budget
            costs_sent[thread] += cost
            future = svc.submit((thread, seq, cost), cost=cost)
            future.add_done_callback(lambda f: endings.append(f))  # list.append is atomic
            futures.append(future)
        for seq, future in enumerate(futures):
            assert future.result(timeout=RESULT_TIMEOUT) == (thread, seq)

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads_n)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    svc.close(timeout=30)
    assert not any(t.is_alive() for t in workers)
    assert len(endings) == len(set(map(id, endings))) == threads_n * per_thread  # each future ended once
    ran = [item for batch in batches for item in batch]
    assert sorted((t, s) for t, s, _ in ran) == [(t, s) for t in range(threads_n) for s in range(per_thread)]
    for thread in range(threads_n):  # each thread's items ran in the order it submitted them
        assert [s for t, s, _ in ran if t == thread] == list(range(per_thread))
    for batch in batches:
        assert len(batch) == 1 or tokens.batch_tokens([c for _, _, c in batch]) <= budget, batch
    st = svc.stats()
    assert st.items_total == threads_n * per_thread and st.batches_total == len(batches)
    assert st.tokens_total == sum(costs_sent) and st.failed_items_total == 0 and st.queue_depth == 0
    assert st.over_budget_batches_total == sum(
        1 for b in batches if tokens.batch_tokens([c for _, _, c in b]) > budget)
    assert st.max_batch_size_seen > 1  # batches did form


@pytest.mark.timeout(60)
def test_the_stage_thread_wakes_when_the_budget_fills_not_at_the_end_of_the_window():
    svc = BatchingService("b", lambda items: items, max_size=8, max_wait_ms=600_000,
                          tokens=TokenPolicy(BatchTokens.SUMMED, 100))
    try:
        first = svc.submit("a", cost=60)
        second = svc.submit("b", cost=60)  # a's batch is full now: it runs at once, not in ten minutes
        assert first.result(timeout=RESULT_TIMEOUT) == "a"
        assert not second.done()  # b has its own window to wait
    finally:
        svc.close(timeout=RESULT_TIMEOUT)  # flushes b
    assert second.result(timeout=0) == "b"


# ----------------------------------------------------------------------------- the reranker's cost


class LengthTokenizer:
    """A tokenizer whose pair (query, document) is as many tokens as the document's words + 2."""

    def __call__(self, pairs, truncation, max_length):
        # Each token id is the document's word count, so a forward's rows tell which pair they are.
        return {"input_ids": [[len(doc.split())] * min(max_length, len(doc.split()) + 2) for _, doc in pairs]}

    def pad(self, encoded, return_tensors):
        import torch
        longest = max(map(len, encoded["input_ids"]))
        return {"input_ids": torch.tensor([ids + [0] * (longest - len(ids)) for ids in encoded["input_ids"]])}


class ForwardRecorder:
    """A model scoring a pair by its document's word count, recording each forward's (rows, width)."""

    def __init__(self):
        self.forwards: list[tuple[int, int]] = []

    def __call__(self, input_ids):
        self.forwards.append(tuple(input_ids.shape))
        return SimpleNamespace(logits=input_ids[:, :1].float())


def test_a_rerank_requests_cost_is_its_pairs_padded_tokens_as_they_run():
    reranker = Reranker(LengthTokenizer(), model=None, placement=None, max_pairs_per_forward=32, max_pad_ratio=1.1)
    docs = tuple(SimpleNamespace(content="w " * n) for n in (98, 198, 100, 200))  # 100, 200, 102, 202 tokens
    request = RerankRequest("q", docs)  # type: ignore[arg-type]
    # Sorted by length: [100, 102] share a forward (204 <= 1.1 x 202), so do [200, 202].
    assert length_groups([100, 200, 102, 202], 32, 1.1) == [[0, 2], [1, 3]]
    assert reranker.request_tokens(request) == 2 * 102 + 2 * 202
    assert reranker.request_tokens(RerankRequest("q", ())) == 0
    reranker.max_pad_ratio = float("inf")  # one padded forward
    assert reranker.request_tokens(request) == 4 * 202


def test_a_rerank_batch_sorts_all_its_requests_pairs_by_length_together():
    model = ForwardRecorder()
    reranker = Reranker(LengthTokenizer(), model, SimpleNamespace(device="cpu"), max_pairs_per_forward=32,
                        max_pad_ratio=1.1)
    first = RerankRequest("q", tuple(SimpleNamespace(content="w " * n) for n in (98, 198)))  # type: ignore[arg-type]
    second = RerankRequest("q", tuple(SimpleNamespace(content="w " * n) for n in (200, 100)))  # type: ignore[arg-type]
    ranked = reranker.rerank([first, second])
    # Two forwards, each holding one pair of each request: the short ones, then the long ones.
    assert model.forwards == [(2, 102), (2, 202)]
    assert [[s.score for s in r] for r in ranked] == [[198.0, 98.0], [200.0, 100.0]]  # each its own, best first
    # Apart, each request runs two forwards of one pair (100 + 200, 102 + 202 tokens): the batch's
    # summed cost is within max_pad_ratio of the tokens it runs, in half the forwards.
    ran = sum(rows * width for rows, width in model.forwards)
    summed = reranker.request_tokens(first) + reranker.request_tokens(second)
    assert (ran, summed) == (2 * 102 + 2 * 202, 300 + 304) and summed <= ran <= 1.1 * summed


class FakeEncoder:
    """A sequence classifier of one label scoring 0, for a stage's own encoding without a model."""

    config = SimpleNamespace(id2label={0: "label"}, num_labels=1)

    def __call__(self, input_ids, **inputs):
        import torch
        return SimpleNamespace(logits=torch.zeros(input_ids.shape[0], 1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stage", [spec.Stage.RERANK, spec.Stage.SENTIMENT])
def test_request_threads_count_tokens_while_the_stage_thread_encodes(model_source, stage):
    from transformers import AutoTokenizer

    from pipeline.classifiers import SentimentClassifier
    docs = tuple(SimpleNamespace(content="word " * n) for n in range(5, 300, 30))
    request = RerankRequest("how do I reset my password", docs)  # type: ignore[arg-type]
    cpu = SimpleNamespace(device="cpu")
    if stage == spec.Stage.RERANK:
        tokenizer = AutoTokenizer.from_pretrained(spec.RERANKER_MODEL, **model_source.hf_kwargs())
        reranker = Reranker(tokenizer, FakeEncoder(), cpu)  # type: ignore[arg-type]
        count, encode = (lambda: reranker.request_tokens(request)), (lambda: reranker.rerank([request] * 3))
    else:
        tokenizer = AutoTokenizer.from_pretrained(spec.SENTIMENT_MODEL, **model_source.hf_kwargs())
        classifier = SentimentClassifier(tokenizer, FakeEncoder(), cpu)  # type: ignore[arg-type]
        # Texts of different lengths, padded together by the stage: its padding changes per call.
        count, encode = (lambda: classifier.tokens("word " * 90)), (lambda: classifier.logits(["a", "b c " * 40]))
    expected = count()
    stop, errors, counts = threading.Event(), [], []

    def stage_thread():
        while not stop.is_set():
            try:
                encode()
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(exc)

    def request_thread():
        try:
            counts.extend(count() for _ in range(150))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    encoder = threading.Thread(target=stage_thread)
    encoder.start()
    requests = [threading.Thread(target=request_thread) for _ in range(6)]
    for t in requests:
        t.start()
    for t in requests:
        t.join(60)
    stop.set()
    encoder.join(60)
    assert errors == [] and counts == [expected] * 900 and expected > 0


# ----------------------------------------------------------------------------- metrics


@pytest.mark.timeout(60)
def test_token_families_come_from_the_snapshot_of_stages_that_count_tokens():
    rerank = BatchingService("rerank", lambda items: items, max_size=8, max_wait_ms=0,
                             tokens=TokenPolicy(BatchTokens.SUMMED, 1000))
    fetch = BatchingService("fetch", lambda items: items, max_size=8, max_wait_ms=0)
    try:
        futures = rerank.submit_many(["a", "b", "c"], costs=[1500, 300, 20])
        assert [f.result(timeout=RESULT_TIMEOUT) for f in futures] == ["a", "b", "c"]
        assert fetch.submit("x").result(timeout=RESULT_TIMEOUT) == "x"
        st = rerank.stats()
        m = scrape([rerank, fetch])
        r = (("stage", "rerank"),)
        assert m[("rag_stage_tokens_total", r)] == st.tokens_total == 1820
        assert m[("rag_stage_item_tokens_count", r)] == 3 and m[("rag_stage_item_tokens_sum", r)] == 1820
        assert m[("rag_stage_item_tokens_bucket", (("le", "32.0"), ("stage", "rerank")))] == 1
        assert m[("rag_stage_item_tokens_bucket", (("le", "512.0"), ("stage", "rerank")))] == 2
        assert m[("rag_stage_item_tokens_bucket", (("le", "+Inf"), ("stage", "rerank")))] == 3
        assert m[("rag_batch_token_budget", r)] == 1000
        assert m[("rag_batch_over_budget_total", r)] == st.over_budget_batches_total == 1  # the 1500 alone
        assert m[("rag_batch_token_closed_total", r)] == st.token_closed_batches_total
        assert not any(labels == (("stage", "fetch"),) for name, labels in m if "token" in name)
    finally:
        rerank.close(timeout=10)
        fetch.close(timeout=10)


# ----------------------------------------------------------------------------- the worker's wiring


class FakeModel:
    """A stage model whose cost is the length of its item's text, recording each batch."""

    def __init__(self, result):
        self.result = result
        self.batches: list[list] = []

    def tokens(self, text: str) -> int:
        return len(text)

    def request_tokens(self, request: RerankRequest) -> int:
        return 100 * len(request.documents)

    def __call__(self, items: list) -> list:
        self.batches.append(list(items))
        return [self.result(item) for item in items]


@pytest.mark.timeout(60)
def test_the_worker_gives_each_encoder_stage_its_items_costs_and_budget():
    docs = (SimpleNamespace(content="d1"), SimpleNamespace(content="d2"))
    embedder, reranker = FakeModel(lambda q: [0.0] * spec.EMBED_DIM), FakeModel(lambda r: [])
    sentiment, toxicity = FakeModel(lambda t: "positive"), FakeModel(lambda t: "false")
    reranker.rerank = reranker  # type: ignore[attr-defined]
    for model in (sentiment, toxicity):
        model.classify = model  # type: ignore[attr-defined]
    stages = SimpleNamespace(embedder=embedder, reranker=reranker, sentiment=sentiment, toxicity=toxicity,
                             store=SimpleNamespace(fetch_batch=lambda id_lists: [docs for _ in id_lists]),
                             generator=SimpleNamespace(generate=lambda requests: ["the answer"] * len(requests)))
    index = SimpleNamespace(search=lambda vectors, k, **kw: ([[1, 2]] * len(vectors), None), close=lambda: None)
    batching = {stage: BatchConfig(4, 0, 16, 250 if stage == spec.Stage.RERANK else 0)
                for stage in spec.WORKER_STAGES}
    worker = Worker(WorkerConfig(batching, request_timeout_s=30, embed_cache_size=0, continuous=None),
                    stages, index)  # type: ignore[arg-type]
    try:
        reply = worker.answer("r1", "how are you")
        assert reply["generated_response"] == "the answer" and reply["sentiment"] == "positive"
        st = worker.stats()
        assert st[spec.Stage.EMBED].tokens_total == len("how are you")
        assert st[spec.Stage.RERANK].tokens_total == 200 and st[spec.Stage.RERANK].max_tokens == 250
        assert st[spec.Stage.SENTIMENT].tokens_total == st[spec.Stage.TOXICITY].tokens_total == len("the answer")
        assert not st[spec.Stage.FETCH].counts_tokens and not st[spec.Stage.GENERATE].counts_tokens
        assert st[spec.Stage.EMBED].max_tokens == 0  # no budget: counted only
    finally:
        worker.close(timeout=10)
