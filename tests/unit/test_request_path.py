"""services/roles/worker/request_path.py: a worker's request path over the tiny stand-ins, node 2 searched
in-process, and how it maps each stage's outcome."""
from __future__ import annotations

import copy
import dataclasses
from concurrent.futures import ThreadPoolExecutor

import faiss
import numpy as np
import pytest

from pipeline import spec
from pipeline.config import Settings
from pipeline.conversation import TURN_FRAME_TOKENS, Conversation, Turn, fit
from pipeline.cpu_features import cpu_supports_bf16
from pipeline.generator import GenerationRequest
from pipeline.precision_policy import LOAD_DTYPE
from pipeline.reference import ReferencePipeline
from pipeline.reranker import RerankRequest
from pipeline.spec import Stage
from pipeline.stages import Stages
from pipeline.vector_index import VectorIndex
from services.roles.worker.request_path import Worker
from services.server.answer import AnswerPiece, FinalAnswer
from services.server.answer_request import AnswerRequest
from services.server.deadline import Deadline
from services.server.stream_response import collect as collect_answer
from tests.helpers import TEST_ENV, InProcessIndex, data_env
from tests.support.running_worker import running_worker


def collect(events) -> dict:
    """The final answer of a worker's stream, as JSON."""
    return collect_answer(events).wire()


class ThreadCountingIndex(InProcessIndex):
    """Notes faiss's OpenMP thread count on the thread each search runs on (the search stage's)."""

    def __init__(self, index):
        super().__init__(index)
        self.threads: list[int] = []

    def search(self, vectors, k, **context):
        self.threads.append(faiss.omp_get_max_threads())
        return super().search(vectors, k, **context)


@pytest.mark.parametrize("faiss_threads", ["1", "3"])
def test_the_search_stage_runs_faiss_at_faiss_threads_whatever_its_caller_set(support_data, stages, faiss_threads):
    """A centroid router's quantizer search runs on the search stage's thread, in faiss's own OpenMP runtime: its
    thread count there is FAISS_THREADS', not the runtime's default for a new thread (the core count)."""
    index = ThreadCountingIndex(VectorIndex.load(support_data.index_path, nprobe=64))
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)  # the caller's own count, unlike either case's
    try:
        with running_worker(support_data, stages, index, {"FAISS_THREADS": faiss_threads}) as worker:
            answer(worker, AnswerRequest("faiss-threads", "How do I reset my password?", max_new_tokens=2))
        assert index.threads and set(index.threads) == {int(faiss_threads)}
    finally:
        faiss.omp_set_num_threads(before)


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

    def counting(query, documents, conversation=None):
        encoded.append(encode(query, documents, conversation))
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


QUERY = "How do I return an item?"


def answer(worker, request: AnswerRequest) -> tuple[str, dict]:
    """The streamed pieces' text joined, and the final answer as JSON."""
    events = list(worker.answer(request, Deadline.after(120)))
    assert all(isinstance(e, AnswerPiece) for e in events[:-1]) and isinstance(events[-1], FinalAnswer)
    return "".join(e.text for e in events[:-1]), events[-1].wire()


def greedy_ids(reference, generator, query: str, new: int) -> tuple[tuple, list[int]]:
    """The query's reranked documents and the oracle's greedy answer ids to it over them."""
    ranked = reference.reranker.rerank([RerankRequest(query, tuple(reference.retrieve(query)))])[0]
    documents = tuple(r.document for r in ranked)
    return documents, generator.generate_ids([generator.prompt_ids(query, documents)], max_new_tokens=new)[0]


def test_the_streamed_pieces_are_the_replys_text_and_the_references_answer_with_a_stop_string(worker, reference):
    full = reference.completion(QUERY, 16).text
    stop = full[len(full) // 2: len(full) // 2 + 4]
    expected = reference.completion(QUERY, 16, (stop,))
    pieces, reply = answer(worker, AnswerRequest("stop-1", QUERY, max_new_tokens=16, stop=(stop,)))
    assert pieces == reply["generated_response"] == expected.text == full[:full.index(stop)]
    assert reply["finish_reason"] == expected.finish_reason == "stop"
    assert reply["usage"]["completion_tokens"] == expected.token_count < 16
    generate = worker.stats()[Stage.GENERATE]
    assert (generate.finished_sequences_total, generate.cancelled_sequences_total) == (1, 0)  # ended, as finished
    plain, reply = answer(worker, AnswerRequest("plain-1", QUERY, max_new_tokens=16))
    assert plain == reply["generated_response"] == full and reply["finish_reason"] == "length"


def test_an_answer_read_whole_takes_its_tokens_after_the_generation_a_streamed_one_as_they_come(
        worker, generator, monkeypatch):
    """A reply read whole with nothing to end on early (no stream, stop strings or tools) is woken once, when its
    generation ends, instead of once a token; the same text either way."""
    visits = []
    enter = worker._enter
    monkeypatch.setattr(worker, "_enter", lambda clock, stage, item: visits.append(enter(clock, stage, item))
                        or visits[-1])
    output = generator.output
    ended_at_push: list[bool] = []

    def watched(*args, **kwargs):
        processor = output(*args, **kwargs)
        push = processor.push
        generation = next(v for v in reversed(visits) if v.stage == Stage.GENERATE)
        processor.push = lambda token: ended_at_push.append(generation.future.done()) or push(token)
        return processor
    monkeypatch.setattr(generator, "output", watched)
    whole = collect(worker.answer(AnswerRequest("whole-1", QUERY, max_new_tokens=24), Deadline.after(120)))
    assert len(ended_at_push) == 24 and all(ended_at_push)
    ended_at_push.clear()
    pieces, streamed = answer(worker, AnswerRequest("streamed-1", QUERY, max_new_tokens=24, stream=True))
    assert len(ended_at_push) == 24 and pieces == streamed["generated_response"] == whole["generated_response"]
    ended_at_push.clear()
    # A gateway's caller that collects the reply: its first piece as it comes, the other tokens after the end.
    events = worker.answer(AnswerRequest("first-1", QUERY, max_new_tokens=24, stream=True), Deadline.after(120),
                           first_piece_only=True)
    assert isinstance(next(events), AnswerPiece)
    before_first = len(ended_at_push)
    rest = list(events)
    assert all(ended_at_push[before_first:]) and len(ended_at_push) == 24
    assert rest[-1].wire()["generated_response"] == whole["generated_response"]


def test_a_stop_string_completed_by_the_last_allowed_token_finishes_with_stop(worker, reference, generator):
    _, ids = greedy_ids(reference, generator, QUERY, 16)
    texts = [generator.completion(ids[:n]).text for n in range(len(ids) + 1)]
    # a cap whose last token adds text, and a stop string that this token completes and nothing before holds
    cap = next(n for n in range(4, len(ids) + 1) if len(texts[n]) - len(texts[n - 1]) >= 2)
    stop = texts[cap][len(texts[cap - 1]) - 1:]
    assert stop not in texts[cap - 1] and texts[cap].endswith(stop)
    pieces, reply = answer(worker, AnswerRequest("last-stop", QUERY, max_new_tokens=cap, stop=(stop,)))
    assert pieces == reply["generated_response"] == texts[cap][:texts[cap].index(stop)]
    assert reply["finish_reason"] == "stop" and reply["usage"]["completion_tokens"] == cap
    assert reference.completion(QUERY, cap, (stop,)).finish_reason == "stop"


def test_eos_on_the_last_allowed_token_finishes_with_stop(reference, generator, support_data, stages):
    documents, ids = greedy_ids(reference, generator, QUERY, 16)
    at = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])  # its first time: the answer ends there
    ending = copy.copy(generator)  # the same model, whose end-of-sequence tokens include ids[at]
    ending.generation_config = copy.deepcopy(generator.generation_config)
    ending.generation_config.eos_token_id = [*generator.eos_ids, ids[at]]
    expected = ending.completions([GenerationRequest(QUERY, documents, at + 1)])  # the oracle, same rule
    assert expected[0].finish_reason == "stop"
    index = InProcessIndex(VectorIndex.load(support_data.index_path, nprobe=64))
    with running_worker(support_data, dataclasses.replace(stages, generator=ending), index, {}) as eos_worker:
        pieces, reply = answer(eos_worker, AnswerRequest("last-eos", QUERY, max_new_tokens=at + 1))
        assert pieces == reply["generated_response"] == ending.completion(ids[:at + 1]).text
        assert reply["finish_reason"] == "stop" and reply["usage"]["completion_tokens"] == at + 1
        _, capped = answer(eos_worker, AnswerRequest("cap-eos", QUERY, max_new_tokens=at))
        assert capped["finish_reason"] == "length" and capped["usage"]["completion_tokens"] == at


# A support conversation whose last turn is a short follow-up (retrieval reads the turn before it too).
CONVERSATION = Conversation((Turn("user", "My order hasn't arrived yet, tracking number is ABC123"),
                             Turn("assistant", "It left our warehouse on Monday."),
                             Turn("user", "Do you ship to Norway?"), Turn("assistant", "Yes, within a week.")),
                            "Answer in one sentence.")
FOLLOW_UP = "and to Canada?"


def conversation_request(request_id: str, conversation: Conversation = CONVERSATION,
                         query: str = FOLLOW_UP) -> AnswerRequest:
    return AnswerRequest(request_id, query, history=conversation.history, instructions=conversation.instructions)


def test_a_conversation_is_answered_alone_and_among_others_as_the_reference_answers_it(worker, reference):
    """A history request's reply does not depend on its batch-mates (other conversations and plain
    questions, whose prompts differ in length), and is the oracle's answer to the same conversation."""
    expected = reference.answer(FOLLOW_UP, "conv-alone", CONVERSATION)
    alone = collect(worker.answer(conversation_request("conv-alone"), Deadline.after(300)))
    assert {k: alone[k] for k in expected} == expected
    assert alone["history_turns_dropped"] == 0
    others = [conversation_request("conv-among"),
              conversation_request("conv-other", Conversation(CONVERSATION.history[:2])),
              conversation_request("conv-long", CONVERSATION, "Can I pay for the Canadian shipping with PayPal?"),
              *(AnswerRequest(f"plain-{i}", query) for i, query in enumerate(spec.REFERENCE_QUERIES[:4]))]
    with ThreadPoolExecutor(len(others)) as pool:
        replies = list(pool.map(lambda request: collect(worker.answer(request, Deadline.after(300))), others))
    among = replies[0]
    assert {k: among[k] for k in expected if k != "request_id"} == {k: alone[k] for k in expected if k != "request_id"}
    assert (among["usage"], among["sources"]) == (alone["usage"], alone["sources"])
    # The history changes the prompt: the follow-up alone is another (shorter) prompt.
    assert replies[4]["usage"]["prompt_tokens"] != alone["usage"]["prompt_tokens"]
    assert "history_turns_dropped" not in replies[4]


def test_the_oldest_turns_beyond_the_budget_are_dropped_as_the_reference_drops_them(reference, support_data, generator,
                                                                                    stages):
    budget = sum(generator.count_tokens(t.content) + TURN_FRAME_TOKENS for t in CONVERSATION.history[2:]) + \
        generator.count_tokens(CONVERSATION.instructions or "")
    fitted = fit(CONVERSATION, generator.count_tokens, budget)
    assert fitted.dropped == 2 and fitted.conversation.history == CONVERSATION.history[2:]
    index = InProcessIndex(VectorIndex.load(support_data.index_path, nprobe=64))
    with running_worker(support_data, stages, index, {"MAX_HISTORY_TOKENS": str(budget)}) as small:
        reply = collect(small.answer(conversation_request("conv-budget"), Deadline.after(300)))
        expected = dataclasses.replace(reference, history_tokens=budget).answer(FOLLOW_UP, "conv-budget", CONVERSATION)
        assert {k: reply[k] for k in expected} == expected and reply["history_turns_dropped"] == 2
        kept = collect(small.answer(conversation_request("conv-kept", fitted.conversation), Deadline.after(300)))
        assert kept["generated_response"] == reply["generated_response"] and kept["usage"] == reply["usage"]
        assert kept["history_turns_dropped"] == 0


def test_the_concurrency_gauge_counts_a_request_from_its_arrival_to_its_answers_end(worker):
    from services.roles.worker.metrics import CONCURRENCY_METRIC, WorkerCollector

    def gauge() -> float:
        (family,) = [f for f in WorkerCollector(lambda: worker).collect() if f.name == CONCURRENCY_METRIC]
        return family.samples[0].value

    assert gauge() == 0
    stream = worker.answer(AnswerRequest("held-1", "Where is my order?", max_new_tokens=4), Deadline.after(120))
    first = next(stream)  # the first piece: the request is in the generate stage now
    assert first and gauge() == 1
    rest = list(stream)
    assert isinstance(rest[-1], FinalAnswer) and gauge() == 0
    closed_early = worker.answer(AnswerRequest("held-2", "Where is my order?", max_new_tokens=4), Deadline.after(120))
    next(closed_early)
    closed_early.close()  # a caller gone early: no longer held
    assert gauge() == 0
    assert list(WorkerCollector(lambda: None).collect()) == []


# ----------------------------------------------------------------------------- precision variants

# Every model in int8, the LLM too (named, not PRECISION=fast: the same variant whatever this
# machine's fast table says); and PRECISION=auto, the default, which on a CPU with bf16
# (avx512_bf16 or AMX) is bfloat16 in every stage. Waits long enough that requests share batches.
INT8 = {f"{stage}_PRECISION": "int8-dynamic" for stage in ("EMBED", "RERANK", "GENERATE", "SENTIMENT", "TOXICITY")}
AUTO = {"PRECISION": "auto", **{f"{stage}_MAX_WAIT_MS": "20" for stage in ("EMBED", "SENTIMENT", "TOXICITY")}}


@pytest.mark.parametrize("env,device,queries", [
    pytest.param(INT8, "int8-dynamic", 5, id="int8-dynamic"),
    pytest.param(AUTO, "bfloat16", 6, id="auto", marks=pytest.mark.skipif(
        not cpu_supports_bf16(), reason="PRECISION=auto is float32 on a CPU without avx512_bf16 or AMX, "
        "which the float32 tests cover")),
])
def test_a_worker_at_a_precision_answers_requests_together_as_the_reference_at_it_alone(
        support_data, model_source, env, device, queries):
    """Requests submitted together (distinct, so batches and the continuous engine's decode steps mix
    them) each get the reference pipeline's answer to it alone, at the same settings: text,
    sentiment and toxicity do not depend on which requests shared a batch, the LLM included: its
    engine (padded, chunked KV cache, sequences joining and leaving) answers token for token as one
    request alone. On one torch thread, as the nodes run (TORCH_THREADS=1)."""
    import torch
    node_env = {**TEST_ENV, **data_env(support_data), "RERANK_MAX_WAIT_MS": "20", **env}
    settings = Settings.from_env(node_env)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    index = InProcessIndex(VectorIndex.load(support_data.index_path, nprobe=settings.index.nprobe))
    try:
        stages = Stages.load(settings, model_source)  # as a node loads them
        with running_worker(support_data, stages, index, node_env) as worker:
            assert worker.stages.devices() == {stage: f"cpu/{device}" for stage in spec.MODEL_STAGES}  # its /health
            reference = ReferencePipeline.from_settings(settings, model_source)
            assert {(model.placement.precision, model.placement.dtype) for model in (reference.embedder,
                    reference.generator)} == {(device, LOAD_DTYPE[device])}
            asked = list(enumerate(spec.REFERENCE_QUERIES[:queries]))
            with ThreadPoolExecutor(len(asked)) as pool:
                replies = list(pool.map(lambda iq: collect(worker.answer(AnswerRequest(f"{device}-{iq[0]}", iq[1]),
                                                                         Deadline.after(300))), asked))
            for (i, query), reply in zip(asked, replies):
                expected = reference.answer(query, f"{device}-{i}")
                assert {k: reply[k] for k in expected} == expected, f"query {query!r} differs from the reference"
    finally:
        torch.set_num_threads(threads)


def test_worker_wait_maps_stage_outcomes():
    import time
    from concurrent.futures import Future

    from services.server.errors import (
        DeadlineExceeded,
        NodeUnreachable,
        Overloaded,
        RequestTimeout,
        ServiceClosed,
        StageFailed,
    )

    def failed(exc):
        future = Future()
        future.set_exception(exc)
        return future

    later = time.monotonic() + 5
    with pytest.raises(StageFailed, match="embed stage failed: ValueError"):
        Worker._wait("embed", failed(ValueError("bad")), later)
    with pytest.raises(StageFailed, match="search stage failed: NodeUnreachable"):
        Worker._wait("search", failed(NodeUnreachable("node 2 down")), later)  # not *this* worker down
    with pytest.raises(RequestTimeout):
        Worker._wait("search", failed(DeadlineExceeded("gave up")), later)
    for exc in (Overloaded("full"), ServiceClosed("closing")):
        with pytest.raises(type(exc)):
            Worker._wait("generate", failed(exc), later)
    pending = Future()
    with pytest.raises(RequestTimeout):
        Worker._wait("rerank", pending, time.monotonic() + 0.05)
    assert pending.cancelled()  # unstarted work is dropped
    done = Future()
    done.set_result([1, 2])
    assert Worker._wait("fetch", done, later) == [1, 2]
