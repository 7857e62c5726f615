"""Continuous batching: the scheduler alone, then the engine and service against the reference."""
from __future__ import annotations

import threading

import pytest

from pipeline import spec
from pipeline.continuous import ContinuousEngine, RunnerOutput, Scheduler
from pipeline.docstore import Document
from pipeline.generator import GenerationRequest
from services.errors import Overloaded
from services.generation import ContinuousGenerationService

EOS = frozenset({0})


# ----------------------------------------------------------------------------- scheduler, no model

def make(max_seqs=2, max_tokens=100, chunk=8) -> Scheduler:
    return Scheduler(max_seqs=max_seqs, max_tokens=max_tokens, prefill_chunk=chunk, eos_ids=EOS)


def test_admission_respects_sequence_and_token_budgets_in_arrival_order():
    s = make(max_seqs=2, max_tokens=60)
    a, b, c = (s.new_sequence([1] * 10, 10) for _ in range(3))  # 20 tokens each
    for seq in (a, b, c):
        s.add(seq)
    s.plan()
    assert s.prefilling == [a, b] and list(s.waiting) == [c]
    s2 = make(max_seqs=8, max_tokens=45)
    x, y = s2.new_sequence([1] * 10, 10), s2.new_sequence([1] * 10, 10)
    z = s2.new_sequence([1] * 4, 1)
    for seq in (x, y, z):
        s2.add(seq)
    s2.plan()
    # y (20) would fit after x? 20 + 20 = 40 <= 45 yes; z (5) too: 45.
    assert s2.prefilling == [x, y, z] and s2.tokens_reserved() == 45


def test_no_overtaking_when_the_head_does_not_fit():
    s = make(max_seqs=8, max_tokens=30)
    big, small = s.new_sequence([1] * 20, 5), s.new_sequence([1] * 2, 2)
    first = s.new_sequence([1] * 4, 4)
    s.add(first), s.add(big), s.add(small)
    s.plan()
    assert s.prefilling == [first] and list(s.waiting) == [big, small]


def test_prefill_is_chunked_within_the_per_iteration_budget():
    s = make(max_seqs=4, max_tokens=1000, chunk=8)
    long, short = s.new_sequence(list(range(1, 21)), 5), s.new_sequence([1, 2, 3], 5)
    s.add(long), s.add(short)
    plan = s.plan()
    assert [(q.seq_id, a, b) for q, a, b in plan.prefill] == [(long.seq_id, 0, 8)]
    s.update_from_output(plan, RunnerOutput(prefilled={long.seq_id: 8}))
    plan = s.plan()
    assert [(a, b) for _, a, b in plan.prefill] == [(8, 16)]
    s.update_from_output(plan, RunnerOutput(prefilled={long.seq_id: 16}))
    plan = s.plan()
    assert [(q.seq_id, a, b) for q, a, b in plan.prefill] == [(long.seq_id, 16, 20), (short.seq_id, 0, 3)]


def test_finish_on_eos_or_token_limit_and_budget_is_released():
    s = make(max_seqs=1, max_tokens=100)
    a, b = s.new_sequence([5, 6], 3), s.new_sequence([7], 3)
    s.add(a), s.add(b)
    s.update_from_output(s.plan(), RunnerOutput(prefilled={a.seq_id: 2}, first_tokens={a.seq_id: 9}))
    assert s.running == [a] and s.plan().prefill == []  # b waits: one sequence at a time
    s.update_from_output(s.plan(), RunnerOutput(decoded={a.seq_id: 9}))
    s.update_from_output(s.plan(), RunnerOutput(decoded={a.seq_id: 9}))
    assert a.finished and a.generated == [9, 9, 9]
    s.drop(a)  # update_from_output already did: dropping again is harmless
    plan = s.plan()
    assert plan.prefill[0][0] is b
    # eos as the first token: done at once, never runs
    s.update_from_output(plan, RunnerOutput(prefilled={b.seq_id: 1}, first_tokens={b.seq_id: 0}))
    assert b.finished and s.running == []


def test_prompt_over_budget_is_refused():
    with pytest.raises(ValueError, match="budget"):
        make(max_tokens=10).new_sequence([1] * 8, 5)
    with pytest.raises(ValueError):
        make().new_sequence([], 5)


# ----------------------------------------------------------------------------- engine vs reference

DOCS = tuple(Document(i, f"Document {i}", "Refunds are issued within 5 days. " * (i + 1), "billing")
             for i in range(3))
REQUESTS = [GenerationRequest(q, DOCS[: i % 4]) for i, q in enumerate(spec.REFERENCE_QUERIES[:5])]


@pytest.fixture(scope="module")
def reference_texts(generator):
    return [generator.generate([r])[0] for r in REQUESTS]


def test_engine_matches_reference_with_staggered_joins(generator, reference_texts):
    engine = ContinuousEngine(generator, max_seqs=3, max_tokens=4096, prefill_chunk=32)
    seqs, pending, step, peak_cache = {}, list(enumerate(REQUESTS)), 0, 0
    budget = max(len(generator.tokenizer(generator.prompt(r.query, r.documents))["input_ids"]) for r in REQUESTS)
    while pending or engine.has_work():
        if pending and step % 9 == 0:  # join at different decode steps
            i, request = pending.pop(0)
            seqs[i] = engine.add(request)
        result = engine.step()
        assert not result.failed
        assert engine.scheduler.tokens_reserved() <= 4096
        peak_cache = max(peak_cache, engine.runner.cache_tokens())
        assert len(engine.runner.rows) <= 3
        step += 1
    assert [engine.text(seqs[i]) for i in range(len(REQUESTS))] == reference_texts
    # memory: never more cache slots than max_seqs rows of the longest sequence
    assert 0 < peak_cache <= 3 * (budget + spec.MAX_NEW_TOKENS)
    assert engine.runner.cache is None and engine.runner.cache_tokens() == 0


def test_service_resolves_futures_as_reference_and_survives_cancel_and_failure(generator, reference_texts):
    engine = ContinuousEngine(generator, max_seqs=4, max_tokens=2048, prefill_chunk=64)
    service = ContinuousGenerationService("generate", engine, max_queue=8)
    try:
        futures = [service.submit(r) for r in REQUESTS[:3]]
        victim = service.submit(REQUESTS[3])
        too_long = service.submit(GenerationRequest("x " * 3000, DOCS))  # over the token budget
        with pytest.raises(ValueError, match="budget"):
            too_long.result(timeout=120)
        # cancel mid-decode: wait until the victim has produced tokens, then cancel it
        seq_started = threading.Event()
        for _ in range(2000):
            active = [s for s in engine.scheduler.running if s.payload.future is victim]
            if active and len(active[0].generated) > 2:
                seq_started.set()
                break
            if victim.done():
                break
            threading.Event().wait(0.01)
        assert seq_started.is_set(), "the victim never started decoding"
        assert victim.cancel()
        assert [f.result(timeout=300) for f in futures] == reference_texts[:3]
        stats = service.stats()
        # the victim was cancelled mid-decode, the over-long prompt failed
        assert stats.cancelled_sequences_total == 1 and stats.batching.failed_items_total == 1
        assert stats.finished_sequences_total == 3 and stats.max_step_sequences > 1
        assert len(service.ttft_seconds()) == 3
    finally:
        service.close(timeout=60)


def test_service_overload_and_close(generator):
    engine = ContinuousEngine(generator, max_seqs=1, max_tokens=2048, prefill_chunk=512)
    service = ContinuousGenerationService("generate", engine, max_queue=2)
    first, second = service.submit(REQUESTS[0]), service.submit(REQUESTS[1])
    with pytest.raises(Overloaded):
        service.submit(REQUESTS[2])
    service.close(timeout=300)  # finishes what it holds
    assert first.result(timeout=1) and second.result(timeout=1)
