"""Prefix KV cache: the scheduler's cuts and bookkeeping with no model, then the engine's logits bit for bit."""
from __future__ import annotations

import pytest
import torch

from pipeline import spec
from pipeline.continuous import ContinuousEngine, RunnerOutput, Scheduler
from pipeline.device import Placement
from pipeline.docstore import Document
from pipeline.generator import GenerationRequest, Generator
from pipeline.precision import LOAD_DTYPE

HEAD = [101, 102, 103, 104, 105]


def make(chunk=8, prefix=HEAD, max_seqs=4) -> Scheduler:
    return Scheduler(max_seqs=max_seqs, max_tokens=1000, prefill_chunk=chunk, eos_ids=frozenset({0}),
                     prefix_ids=prefix)


def run_prefill(s: Scheduler, *, stored: bool = True, fail: frozenset[int] = frozenset()) -> list:
    """One plan executed as a runner would (prefix stored when asked); returns the plan."""
    plan = s.plan()
    s.update_from_output(plan, RunnerOutput(
        prefilled={q.seq_id: b for q, _a, b in plan.prefill if q.seq_id not in fail},
        first_tokens={q.seq_id: 7 for q, _a, b in plan.prefill if b == q.prompt_len and q.seq_id not in fail},
        failed={i: RuntimeError("boom") for i in fail},
        prefix_stored=stored and plan.prefix_store is not None and plan.prefix_store.seq_id not in fail))
    return plan


def chunks_of(s: Scheduler, seq) -> list[tuple[int, int]]:
    seen = []
    while seq in s.prefilling or seq in s.waiting:
        plan = run_prefill(s)
        seen += [(a, b) for q, a, b in plan.prefill if q is seq]
    return seen


# ----------------------------------------------------------------------------- scheduler, no model

def test_the_prefix_matches_by_ids_only_when_the_prompt_goes_on_past_it():
    s = make()
    assert s.prefix_len_of(HEAD + [1]) == 5
    assert s.prefix_len_of(HEAD) == 0  # nothing left to run: the first token needs the last prompt token's logits
    assert s.prefix_len_of(HEAD[:4] + [999, 1, 2]) == 0  # the head's last token merged otherwise
    assert s.prefix_len_of([1] + HEAD) == 0
    assert make(prefix=()).prefix_len_of(HEAD + [1]) == 0
    assert s.new_sequence(HEAD + [1, 2], 3).prefix_len == 5 and s.new_sequence([1, 2], 3).prefix_len == 0


def test_a_cold_prefill_stores_the_prefix_and_later_ones_start_from_it_with_the_same_cuts_after_it():
    s = make(chunk=8)
    cold = s.new_sequence(HEAD + list(range(1, 16)), 4)  # 20 tokens
    s.add(cold)
    plan = s.plan()
    assert [(a, b) for _q, a, b in plan.prefill] == [(0, 5)] and plan.prefix_store is cold and not plan.prefix_hits
    s.update_from_output(plan, RunnerOutput(prefilled={cold.seq_id: 5}, prefix_stored=True))
    assert s.prefix_cached and chunks_of(s, cold) == [(5, 8), (8, 16), (16, 20)]
    warm = s.new_sequence(HEAD + list(range(1, 16)), 4)
    s.add(warm)
    plan = s.plan()
    assert plan.prefix_hits == [warm] and plan.prefix_store is None
    assert [(a, b) for q, a, b in plan.prefill if q is warm] == [(5, 8)]  # cut where the cold one was
    s.update_from_output(plan, RunnerOutput(prefilled={warm.seq_id: 8}))
    assert chunks_of(s, warm) == [(8, 16), (16, 20)]
    assert (s.prefix_hits, s.prefix_misses, s.prefix_tokens_saved) == (1, 1, 5)
    # a prompt without the head runs from token 0 as before, cut only at multiples of the chunk
    other = s.new_sequence(list(range(1, 21)), 4)
    s.add(other)
    assert chunks_of(s, other) == [(0, 8), (8, 16), (16, 20)]
    assert (s.prefix_hits, s.prefix_misses, s.prefix_tokens_saved) == (1, 2, 5)


def test_a_prefix_longer_than_a_chunk_is_cut_at_chunks_and_at_its_end():
    s = make(chunk=4, prefix=list(range(100, 110)))  # 10-token head
    cold = s.new_sequence(list(range(100, 110)) + [1, 2, 3], 2)
    s.add(cold)
    assert chunks_of(s, cold) == [(0, 4), (4, 8), (8, 10), (10, 12), (12, 13)]
    warm = s.new_sequence(list(range(100, 110)) + [1, 2, 3], 2)
    s.add(warm)
    assert chunks_of(s, warm) == [(10, 12), (12, 13)]


def test_without_a_prefix_nothing_changes_and_nothing_is_counted():
    s = make(prefix=())
    seq = s.new_sequence(HEAD + list(range(1, 16)), 4)
    s.add(seq)
    assert chunks_of(s, seq) == [(0, 8), (8, 16), (16, 20)]
    assert (s.prefix_cached, s.prefix_hits, s.prefix_misses, s.prefix_tokens_saved) == (False, 0, 0, 0)


def test_one_sequence_stores_the_prefix_and_a_failed_store_leaves_the_cache_cold():
    s = make(chunk=16)
    a, b, c = (s.new_sequence(HEAD + [1, 2, 3], 2) for _ in range(3))
    s.add(a), s.add(b)
    plan = run_prefill(s, fail=frozenset({a.seq_id}))  # both run their head; a, the one storing, fails
    assert plan.prefix_store is a and [q for q, _a, _b in plan.prefill] == [a, b]
    assert not s.prefix_cached and s.prefix_misses == 1  # b's prefill counts, a's failed one does not
    s.add(c)
    plan = run_prefill(s)  # b goes on past its head; c is cold and stores
    assert plan.prefix_store is c and not plan.prefix_hits and s.prefix_cached


def test_a_hit_that_fails_is_not_counted():
    s = make()
    s.prefix_cached = True  # as after a stored prefix
    seq = s.new_sequence(HEAD + [1, 2], 3)
    s.add(seq)
    plan = run_prefill(s, fail=frozenset({seq.seq_id}))
    assert plan.prefix_hits == [seq] and (s.prefix_hits, s.prefix_tokens_saved) == (0, 0)


# ----------------------------------------------------------------------------- the generator's head

DOCS = tuple(Document(i, f"Document {i}", "Refunds are issued to the original payment method within 5 business "
                      "days. " * (i + 1), "billing") for i in range(3))


def test_the_prompt_head_is_what_every_prompt_with_documents_starts_with(generator):
    head = generator.prompt_head_ids()
    text = generator.tokenizer.decode(head)
    assert text.startswith("<|im_start|>system\n" + spec.SYSTEM_PROMPT) and text.endswith("Context:\n")
    for i, query in enumerate(spec.REFERENCE_QUERIES):
        ids = generator.tokenizer(generator.prompt(query, DOCS[: 1 + i % 3]))["input_ids"]
        assert ids[:len(head)] == head and len(ids) > len(head)


# ----------------------------------------------------------------------------- bit for bit, per precision

class LogitsRecorder:
    """Wraps a model: keeps each call's last-position logits."""

    def __init__(self, model):
        self.model, self.logits = model, []

    def __call__(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        self.logits.append(out.logits[:, -1].clone())
        return out

    def __getattr__(self, attr):
        return getattr(self.model, attr)


@pytest.fixture(scope="module", params=("float32", "bfloat16", "int8-dynamic", "int8-weight"))
def variant_generator(request, model_source):
    return Generator.load(model_source, Placement("cpu", LOAD_DTYPE[request.param], request.param))


REQUEST = GenerationRequest(spec.REFERENCE_QUERIES[1], DOCS)


def prefill_logits(engine: ContinuousEngine, request: GenerationRequest):
    """The engine's next-token logits at the end of the request's prompt, and the sequence (run to its end)."""
    recorder = LogitsRecorder(engine.runner.model)
    engine.runner.model = recorder
    seq = engine.add(request)
    while not seq.generated:
        assert not engine.step().failed
    logits = recorder.logits[-1]
    while engine.has_work():
        assert not engine.step().failed
    engine.runner.model = recorder.model
    return logits, seq


def test_a_hit_gives_the_logits_and_ids_of_a_prefill_that_computes_the_head(variant_generator):
    generator = variant_generator
    # Prompts of ~150 tokens, chunks of 64: a chunk past the head, then whole chunks.
    cold_engine = ContinuousEngine(generator, max_seqs=2, max_tokens=4096, prefill_chunk=64, prefix_cache=True)
    cold_logits, cold = prefill_logits(cold_engine, REQUEST)
    assert cold_engine.stats().prefix_cache_misses_total == 1 and cold_engine.runner.prefix is not None

    warm_engine = ContinuousEngine(generator, max_seqs=2, max_tokens=4096, prefill_chunk=64, prefix_cache=True)
    prefill_logits(warm_engine, GenerationRequest(spec.REFERENCE_QUERIES[0], DOCS[:1]))  # stores the head
    stored = [(k.clone(), v.clone()) for k, v in warm_engine.runner.prefix]
    warm_logits, warm = prefill_logits(warm_engine, REQUEST)
    stats = warm_engine.stats()
    head = len(generator.prompt_head_ids())
    assert (stats.prefix_cache_hits_total, stats.prefix_cache_misses_total) == (1, 1)
    assert stats.prefix_cache_tokens_saved_total == head == warm.prefix_len

    assert torch.equal(warm_logits, cold_logits)
    assert warm.generated == cold.generated
    # the stored head was only read: hits got copies
    assert all(torch.equal(k, sk) and torch.equal(v, sv) for (k, v), (sk, sv) in zip(warm_engine.runner.prefix, stored))

    # the same logits as the model run by hand, head then the rest, from an empty cache
    from transformers import DynamicCache
    ids = generator.tokenizer(generator.prompt(REQUEST.query, REQUEST.documents))["input_ids"]
    cache, cuts = DynamicCache(), [0, head, 64, 128, len(ids)]
    with torch.inference_mode():
        for a, b in zip(cuts, cuts[1:]):
            out = generator.model(input_ids=torch.tensor([ids[a:b]]), position_ids=torch.arange(a, b)[None],
                                  attention_mask=torch.ones((1, b), dtype=torch.long), past_key_values=cache,
                                  use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
    assert 128 < len(ids) < 192
    assert torch.equal(out.logits[:, -1], warm_logits)


def test_with_the_cache_off_the_prompt_is_one_forward_as_before(variant_generator):
    generator = variant_generator
    engine = ContinuousEngine(generator, max_seqs=2, max_tokens=4096, prefill_chunk=512, prefix_cache=False)
    logits, _seq = prefill_logits(engine, REQUEST)
    inputs = generator.tokenizer([generator.prompt(REQUEST.query, REQUEST.documents)], return_tensors="pt")
    with torch.inference_mode():
        whole = generator.model(**inputs, logits_to_keep=1).logits[:, -1]
    assert torch.equal(logits, whole)
    assert engine.runner.prefix is None and engine.stats().prefix_cache_misses_total == 0


# Prompts of 1-3 documents, long and short, 24 new tokens each.
STAGGERED = [GenerationRequest(q, DOCS[: 1 + i % 3], max_new_tokens=24)
             for i, q in enumerate(spec.REFERENCE_QUERIES[:5])]


def test_with_the_cache_on_an_answer_depends_neither_on_batch_mates_nor_on_the_cache_being_warm(variant_generator):
    generator = variant_generator

    def engine():
        return ContinuousEngine(generator, max_seqs=3, max_tokens=8192, prefill_chunk=32, prefix_cache=True)

    alone = []
    for request in STAGGERED:  # each in a fresh engine: the cache cold, the head computed by its own prefill
        e = engine()
        seq = e.add(request)
        while e.has_work():
            assert not e.step().failed
        alone.append(seq.generated)
    e, seqs, pending, step = engine(), [], list(STAGGERED), 0
    while pending or e.has_work():
        if pending and step % 3 == 0:  # joins while others prefill and decode
            seqs.append(e.add(pending.pop(0)))
        assert not e.step().failed
        step += 1
    assert [s.generated for s in seqs] == alone
    assert e.stats().prefix_cache_hits_total == len(STAGGERED) - 1
