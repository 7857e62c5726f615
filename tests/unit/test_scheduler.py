"""pipeline/continuous/scheduler.py with no model: admission within the sequence and token budgets in
arrival order, whole slots, chunked prefill whose boundaries do not depend on company, finishing,
and plan/update."""
from __future__ import annotations

import pytest

from pipeline.continuous import RunnerOutput, Scheduler
from pipeline.continuous.slots import SlotRule
from tests.helpers import ManualClock

EOS = frozenset({0})


def make(max_batch=2, kv_cache_tokens=100, chunk=8, slot_tokens=1) -> Scheduler:
    return Scheduler(SlotRule(max_batch, kv_cache_tokens, slot_tokens), prefill_chunk=chunk, eos_ids=EOS)


def budgets(s: Scheduler, joining=None) -> list[int]:
    return [q.budget_tokens for q in s.active + ([joining] if joining else [])]


def test_admission_respects_sequence_and_token_budgets_in_arrival_order():
    s = make(max_batch=2, kv_cache_tokens=60)
    a, b, c = (s.new_sequence([1] * 10, 10) for _ in range(3))  # 20 tokens each
    for seq in (a, b, c):
        s.add(seq)
    s.plan()
    assert s.prefilling == [a, b] and list(s.waiting) == [c]
    s2 = make(max_batch=8, kv_cache_tokens=45)
    x, y = s2.new_sequence([1] * 10, 10), s2.new_sequence([1] * 10, 10)
    z = s2.new_sequence([1] * 4, 1)
    for seq in (x, y, z):
        s2.add(seq)
    s2.plan()
    # Every slot is as long as the longest budget: x and y take 2 x 20 = 40 <= 45; z's slot would be
    # 20 long too (3 x 20 = 60 > 45), although its own budget is 5.
    assert s2.prefilling == [x, y] and list(s2.waiting) == [z]
    assert s2.slots.layout(budgets(s2)) == (2, 20) and s2.slots.layout(budgets(s2, z)) == (2, 20)
    assert s2.tokens_reserved() == 40


def test_slots_are_counted_in_whole_multiples_of_slot_tokens():
    s = make(max_batch=8, kv_cache_tokens=100, slot_tokens=32)
    seqs = [s.new_sequence([1] * 10, 10) for _ in range(4)]  # 20 tokens each: a slot of 32
    for seq in seqs:
        s.add(seq)
    s.plan()
    assert s.prefilling == seqs[:3] and s.slots.layout(budgets(s)) == (3, 32)  # a fourth slot: 128 > 100
    with pytest.raises(ValueError, match="budget"):
        s.new_sequence([1] * 90, 10)  # 100 tokens round up to a slot of 128


def test_no_overtaking_when_the_head_does_not_fit():
    s = make(max_batch=8, kv_cache_tokens=30)
    big, small = s.new_sequence([1] * 20, 5), s.new_sequence([1] * 2, 2)
    first = s.new_sequence([1] * 4, 4)
    s.add(first), s.add(big), s.add(small)
    s.plan()
    assert s.prefilling == [first] and list(s.waiting) == [big, small]


def test_prefill_is_chunked_within_the_per_iteration_budget():
    s = make(max_batch=4, kv_cache_tokens=1000, chunk=8)
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


def test_a_prompts_chunk_boundaries_do_not_depend_on_the_prompts_prefilling_beside_it():
    # Rounding in a prefill depends on where its chunks start and end (visibly in bfloat16): a prompt
    # cut wherever another prompt left the iteration's budget would answer differently in company.
    def chunks_of(target_len: int, others: list[int]) -> list[tuple[int, int]]:
        s = make(max_batch=8, kv_cache_tokens=1000, chunk=8)
        seqs = [s.new_sequence(list(range(1, n + 1)), 5) for n in others]
        target = s.new_sequence(list(range(1, target_len + 1)), 5)
        for seq in [*seqs, target]:
            s.add(seq)
        seen = []
        while target in s.prefilling or target in s.waiting:
            plan = s.plan()
            assert sum(b - a for _, a, b in plan.prefill) <= 8  # the per-iteration budget still holds
            seen += [(a, b) for q, a, b in plan.prefill if q is target]
            s.update_from_output(plan, RunnerOutput(prefilled={q.seq_id: b for q, _a, b in plan.prefill},
                                                    first_tokens={q.seq_id: 1 for q, _a, b in plan.prefill
                                                                  if b == q.prompt_len}))
        return seen
    alone = chunks_of(20, [])
    assert alone == [(0, 8), (8, 16), (16, 20)]
    for others in ([4], [12], [3, 6], [21, 2]):
        assert chunks_of(20, others) == alone, others


def test_finish_on_eos_or_token_limit_and_budget_is_released():
    s = make(max_batch=1, kv_cache_tokens=100)
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
        make(kv_cache_tokens=10).new_sequence([1] * 8, 5)
    with pytest.raises(ValueError):
        make().new_sequence([], 5)


def test_plan_lists_decode_and_admissions_and_update_drops_failures():
    clock = ManualClock(100.0)
    s = Scheduler(SlotRule(2, 100), prefill_chunk=16, eos_ids=frozenset({0}), clock=clock)
    a, b, c = (s.new_sequence([1, 2, 3], 4) for _ in range(3))
    for seq in (a, b, c):
        s.add(seq)
    plan = s.plan()
    assert plan.admitted == [a, b] and plan.decode == [] and [ch.seq for ch in plan.prefill] == [a, b]
    clock.now += 1
    update = s.update_from_output(plan, RunnerOutput(prefilled={a.seq_id: 3}, first_tokens={a.seq_id: 5},
                                                     failed={b.seq_id: ValueError("bad prompt")}))
    assert update.failed == [(b, update.failed[0][1])] and update.finished == []
    assert s.running == [a] and a.first_token_at == 101.0 and a.generated == [5]
    plan = s.plan()  # b's slot went to c
    assert plan.decode == [a] and plan.admitted == [c]
    update = s.update_from_output(plan, RunnerOutput(prefilled={c.seq_id: 3}, decoded={a.seq_id: 0},
                                                     first_tokens={c.seq_id: 7}))
    assert update.finished == [a] and a.finished and s.running == [c]  # eos: a left at once
    assert s.tokens_reserved() == c.budget_tokens


def test_a_prompts_last_token_never_prefills_as_a_chunk_of_its_own():
    # One query attends as a decode step does (chunked attention), where the prompt alone gives its last token
    # the prompt's attention; on CUDA the two round apart. So a last chunk of one token joins the one before.
    def cuts_of(length: int) -> list[tuple[int, int]]:
        s = make(max_batch=4, kv_cache_tokens=1000, chunk=8)
        seq = s.new_sequence(list(range(1, length + 1)), 5)
        s.add(seq)
        cuts = []
        while seq.prefilled < seq.prompt_len:
            plan = s.plan()
            cuts += [(a, b) for _, a, b in plan.prefill]
            s.update_from_output(plan, RunnerOutput(prefilled={seq.seq_id: plan.prefill[0].end}))
        return cuts
    # nine tokens run in one iteration over its budget of eight: a prompt's first chunk of an iteration always runs
    assert cuts_of(17) == [(0, 8), (8, 17)] and cuts_of(9) == [(0, 9)]
    assert cuts_of(18) == [(0, 8), (8, 16), (16, 18)] and cuts_of(16) == [(0, 8), (8, 16)] and cuts_of(1) == [(0, 1)]
    with pytest.raises(ValueError, match="prefill_chunk must be >= 2"):
        make(chunk=1)
