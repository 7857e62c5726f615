"""services/stages/continuous.py, the generate stage: futures, statistics and metric families on a
model-free engine over the real scheduler; a failing iteration, abort, streaming and stop; and the
service over the real engine against the reference."""
from __future__ import annotations

import dataclasses
import threading

import pytest
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families

from pipeline.continuous import ContinuousEngine, RunnerOutput, Scheduler, SlotRule, StepResult
from pipeline.continuous.output import Finish
from pipeline.generator import GenerationRequest
from services.server.errors import Overloaded, ServiceClosed, StageDown
from services.server.metrics import NodeMetrics
from services.stages.batching import BatchingService
from services.stages.continuous import ContinuousGenerationService, GenerationStats, GenerationTicket
from services.stages.metrics import StageCollector
from services.stages.protocol import StageService
from tests.helpers import engine_requests, wait_until

# ----------------------------------------------------------------------------- generation stats and metrics, a model-free engine


class FakeRunner:
    def cache_tokens(self):
        return 12

    def graph_counts(self):
        return 30, 2


class FakeEngine(ContinuousEngine):
    """The real scheduler with a model-free runner: every decode step yields token 7."""

    def __init__(self, max_batch=2):  # no generator: the engine's model parts are replaced below
        self.eos_ids = frozenset({0})
        self.scheduler = Scheduler(SlotRule(max_batch, 1000), prefill_chunk=64, eos_ids=self.eos_ids)
        self.runner = FakeRunner()
        self.gate = threading.Event()
        self.gate.set()
        self.stepping = threading.Event()

    def add(self, request, payload=None):
        prompt, cap = request
        seq = self.scheduler.new_sequence(list(range(1, prompt + 1)), cap, payload)
        self.scheduler.add(seq)
        return seq

    def cancel(self, seq):
        self.scheduler.drop(seq)

    def step(self):
        self.stepping.set()
        self.gate.wait(10)
        plan = self.scheduler.plan()
        out = RunnerOutput(prefilled={ch.seq.seq_id: ch.end for ch in plan.prefill},
                           first_tokens={ch.seq.seq_id: 7 for ch in plan.prefill if ch.end == ch.seq.prompt_len},
                           decoded={seq.seq_id: 7 for seq in plan.decode})
        update = self.scheduler.update_from_output(plan, out)
        return StepResult(update.finished, update.failed, len(plan.decode), plan.admitted, update.appended)


def scrape(services) -> dict:
    app = Flask("t")
    metrics = NodeMetrics()
    metrics.register(StageCollector(lambda: services))
    metrics.instrument(app)
    text = app.test_client().get("/metrics").get_data(as_text=True)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.timeout(60)
def test_generation_stats_and_metric_families():
    engine = FakeEngine()
    gen = ContinuousGenerationService("generate", engine, max_queue=8)
    embed = BatchingService("embed", lambda items: items, max_size=4, max_wait_ms=1)
    try:
        assert isinstance(gen, StageService) and isinstance(embed, StageService)
        engine.gate.clear()
        futures = [gen.submit((5, 3))]
        assert engine.stepping.wait(10)  # the loop holds the first request; the next two queue up
        futures += [gen.submit((5, 3)) for _ in range(2)]
        engine.gate.set()
        assert [f.result(timeout=10) for f in futures] == [Finish.LENGTH] * 3
        assert embed.submit_many([1, 2, 3])[2].result(timeout=10) == 3
        st = gen.stats()
        assert isinstance(st, GenerationStats)
        assert st.finished_sequences_total == 3 and st.tokens_generated_total == 9
        assert sum(st.ttft_bucket_counts) == 3 and st.ttft_seconds_sum >= 0
        assert st.batching.items_total == 3 and st.batching.failed_items_total == 0
        assert sum(size * n for size, n in st.batching.batch_size_counts.items()) == 3
        assert st.max_step_sequences == 2 and st.running_sequences == 0 and st.waiting_sequences == 0
        assert sum(st.step_sequences_counts.values()) == st.decode_steps_total
        assert set(st.summary()) >= {"batches", "items", "max_batch", "queue_depth"}
        assert st.summary()["max_batch"] == 2

        m = scrape([embed, gen])
        for stage in ("embed", "generate"):
            label = (("stage", stage),)
            assert m[("rag_batch_size_sum", label)] == m[("rag_batch_items_total", label)] == 3
            assert m[("rag_batch_size_count", label)] == m[("rag_batches_total", label)] >= 1
        g = (("stage", "generate"),)
        assert m[("rag_generate_decode_steps_total", g)] == st.decode_steps_total
        assert m[("rag_generate_step_sequences_count", g)] == st.decode_steps_total
        assert m[("rag_generate_step_sequences_sum", g)] == 2 * 3  # each of 3 sequences decoded twice
        assert m[("rag_generate_tokens_total", g)] == 9
        assert m[("rag_generate_ttft_seconds_count", g)] == 3
        assert m[("rag_generate_running_sequences", g)] == 0 and m[("rag_generate_waiting_sequences", g)] == 0
        assert m[("rag_generate_kv_tokens", (("stage", "generate"), ("state", "in_use")))] == 12
        assert ("rag_generate_kv_tokens", (("stage", "generate"), ("state", "reserved"))) in m
        assert m[("rag_generate_kv_tokens", (("stage", "generate"), ("state", "capacity")))] == 1000  # FakeEngine's budget
        assert (st.cuda_graphs_recorded, st.cuda_graphs_failed) == (30, 2)
        assert m[("rag_generate_cuda_graphs", (("stage", "generate"), ("state", "recorded")))] == 30
        assert m[("rag_generate_cuda_graphs", (("stage", "generate"), ("state", "failed")))] == 2
        assert not any(name.startswith("rag_generate") and labels == (("stage", "embed"),) for name, labels in m)
    finally:
        gen.close(timeout=10)
        embed.close(timeout=10)


def test_generation_ticket_is_the_sequence_payload():
    engine = FakeEngine()
    gen = ContinuousGenerationService("generate", engine, max_queue=2)
    try:
        future = gen.submit((3, 2))
        assert future.result(timeout=10) is Finish.LENGTH
        with pytest.raises(Overloaded) as info:
            for _ in range(3):
                gen.submit((3, 900))
        assert info.value.retry_after_s > 0
        seqs = engine.scheduler.active + list(engine.scheduler.waiting)
        assert all(isinstance(s.payload, GenerationTicket) for s in seqs)
    finally:
        gen.close(timeout=10)


@pytest.mark.timeout(30)
def test_requests_off_the_queue_count_against_max_queue_while_their_prompts_are_encoded():
    # The loop takes a request off the queue, then encodes its prompt (engine.add): meanwhile it is
    # neither queued nor held, unless the service holds it from the moment it takes it.
    class SlowAdd(FakeEngine):
        def __init__(self):
            super().__init__()
            self.adding, self.added = threading.Event(), threading.Event()

        def add(self, request, payload=None):
            self.adding.set()
            assert self.added.wait(10)
            return super().add(request, payload)

    engine = SlowAdd()
    gen = ContinuousGenerationService("generate", engine, max_queue=2)
    try:
        first = gen.submit((3, 2))
        assert engine.adding.wait(10)  # taken off the queue, its prompt being encoded
        second = gen.submit((3, 2))
        with pytest.raises(Overloaded):
            gen.submit((3, 2))
        engine.added.set()
        assert [first.result(timeout=10), second.result(timeout=10)] == [Finish.LENGTH] * 2
    finally:
        engine.added.set()
        gen.close(timeout=10)


@pytest.mark.timeout(30)
def test_on_idle_runs_on_the_loop_when_nothing_decodes_not_between_steps():
    engine = FakeEngine()
    calls: list[tuple[str, int]] = []
    idle = threading.Condition()

    def on_idle():
        with idle:
            calls.append((threading.current_thread().name, len(engine.scheduler.active)))
            idle.notify_all()

    gen = ContinuousGenerationService("generate", engine, max_queue=8, on_idle=on_idle)
    try:
        with idle:
            assert idle.wait_for(lambda: len(calls) == 1, 10)  # at start, with nothing to decode
        engine.gate.clear()
        first = gen.submit((5, 4))
        assert engine.stepping.wait(10)
        second = gen.submit((5, 4))  # joins while the first decodes: no idle between them
        engine.gate.set()
        assert [first.result(timeout=10), second.result(timeout=10)] == [Finish.LENGTH] * 2
        with idle:
            assert idle.wait_for(lambda: len(calls) == 2, 10)
        assert gen.stats().decode_steps_total >= 3
        assert calls == [("continuous-generate", 0)] * 2
    finally:
        gen.close(timeout=10)


def test_on_start_runs_on_the_loop_before_it_serves():
    engine = FakeEngine()
    seen = []
    gen = ContinuousGenerationService("generate", engine, max_queue=8, on_start=lambda: seen.append(
        (threading.current_thread().name, engine.stepping.is_set())))
    try:
        assert gen.submit((5, 4)).result(timeout=10) == Finish.LENGTH
        assert gen.submit((5, 4)).result(timeout=10) == Finish.LENGTH
        assert seen == [("continuous-generate", False)]  # once, before any step
    finally:
        gen.close(timeout=10)


def test_service_overload_and_close():
    engine = FakeEngine(max_batch=1)
    engine.gate.clear()  # the first request's step waits until the third has been refused
    service = ContinuousGenerationService("generate", engine, max_queue=2)
    first, second = service.submit((5, 3)), service.submit((5, 3))
    with pytest.raises(Overloaded):
        service.submit((5, 3))
    engine.gate.set()
    service.close(timeout=30)  # finishes what it holds
    assert first.result(timeout=1) == second.result(timeout=1) == Finish.LENGTH


# ----------------------------------------------------------------------------- a failing iteration, abort


class FailingEngine(FakeEngine):
    """Every step fails; `cleanup_fails`: releasing a sequence fails too (the loop's cleanup)."""

    def __init__(self, cleanup_fails: bool):
        super().__init__()
        self.cleanup_fails = cleanup_fails
        self.steps = 0

    def step(self):
        self.steps += 1
        self.stepping.set()
        assert self.gate.wait(10)
        raise RuntimeError("step failed")

    def cancel(self, seq):
        if self.cleanup_fails:
            raise RuntimeError("cleanup failed")
        super().cancel(seq)


@pytest.mark.timeout(30)
def test_a_failed_iteration_whose_cleanup_fails_too_fails_everything_held_and_the_stage_is_down():
    engine = FailingEngine(cleanup_fails=True)
    gen = ContinuousGenerationService("generate", engine, max_queue=8)
    try:
        engine.gate.clear()
        running = gen.submit((5, 3))
        assert engine.stepping.wait(10)
        queued = gen.submit((5, 3))  # waits in the queue while the failing step runs
        engine.gate.set()
        with pytest.raises(RuntimeError, match="generation failed"):  # its own iteration's failure
            running.result(timeout=10)
        with pytest.raises(StageDown, match="generate stage stopped"):  # failed at once, not at a deadline
            queued.result(timeout=10)
        assert "cleanup failed" in gen.failure
        with pytest.raises(StageDown):
            gen.submit((5, 3))
        assert gen.stats().batching.failed_items_total == 2
    finally:
        gen.close(timeout=10)


@pytest.mark.timeout(30)
def test_a_failed_iteration_with_a_working_cleanup_fails_its_sequences_and_the_loop_serves_on():
    engine = FailingEngine(cleanup_fails=False)
    gen = ContinuousGenerationService("generate", engine, max_queue=8)
    try:
        with pytest.raises(RuntimeError, match="generation failed"):
            gen.submit((5, 3)).result(timeout=10)
        assert gen.failure is None
        with pytest.raises(RuntimeError, match="generation failed"):
            gen.submit((5, 3)).result(timeout=10)  # the loop is still there to take it
        assert engine.steps == 2
    finally:
        gen.close(timeout=10)


@pytest.mark.timeout(30)
def test_generation_abort_fails_a_decoding_request_at_once_and_refuses_new_ones():
    engine = FakeEngine()
    gen = ContinuousGenerationService("generate", engine, max_queue=8)
    engine.gate.clear()
    decoding = gen.submit((5, 3))
    assert engine.stepping.wait(10)
    gen.abort("node 0 is stopping")
    with pytest.raises(ServiceClosed, match="node 0 is stopping"):
        decoding.result(timeout=1)  # while the step is still running
    with pytest.raises(ServiceClosed):
        gen.submit((5, 3))
    assert gen.failure is None  # stopped on purpose: not a dead stage
    engine.gate.set()
    gen.close(timeout=10)


# ----------------------------------------------------------------------------- streaming: tokens as they come


@dataclasses.dataclass(frozen=True)
class StreamedRequest:
    """What FakeEngine.add unpacks (prompt length, cap), with a stream reader."""
    prompt: int
    cap: int
    on_token: object

    def __iter__(self):
        return iter((self.prompt, self.cap))


def test_a_streamed_sequence_hands_each_token_to_its_reader_before_its_future_resolves():
    engine = FakeEngine()
    gen = ContinuousGenerationService("generate", engine, max_queue=4)
    seen, resolved_at = [], []
    try:
        future = gen.submit(StreamedRequest(3, 4, lambda token: seen.append((token, future.done()))))
        future.add_done_callback(lambda f: resolved_at.append(len(seen)))
        assert future.result(timeout=10) is Finish.LENGTH
        assert seen == [(7, False)] * 4 and resolved_at == [4]  # every token first, then how it ended
        plain = gen.submit((3, 2))  # not streamed: no reader, same path
        assert plain.result(timeout=10) is Finish.LENGTH
    finally:
        gen.close(timeout=10)


def test_a_reader_that_raises_does_not_stop_the_engine_or_its_answer():
    engine = FakeEngine()
    gen = ContinuousGenerationService("generate", engine, max_queue=4)

    def broken(token):
        raise ValueError("reader bug")

    try:
        assert gen.submit(StreamedRequest(3, 2, broken)).result(timeout=10) is Finish.LENGTH
        assert gen.submit((2, 1)).result(timeout=10) is Finish.LENGTH and gen.failure is None
    finally:
        gen.close(timeout=10)


def test_stop_ends_a_sequence_at_the_next_iteration_as_finished_not_cancelled():
    engine = FakeEngine()
    gen = ContinuousGenerationService("generate", engine, max_queue=4)
    seen = []

    def read(token):  # its output side finds a stop string in the first token
        seen.append(token)
        gen.stop(future)

    try:
        engine.gate.clear()  # no step before `future` is bound
        future = gen.submit(StreamedRequest(3, 100, read))
        engine.gate.set()
        assert future.result(timeout=10) is Finish.ABORTED
        assert seen == [7]  # ended before the next step
        st = gen.stats()
        assert (st.finished_sequences_total, st.cancelled_sequences_total, st.tokens_generated_total) == (1, 0, 1)
        assert gen.submit((2, 2)).result(timeout=10) is Finish.LENGTH  # the others go on
        gen.stop(future)  # once ended: nothing to do
        assert gen.submit((2, 1)).result(timeout=10) is Finish.LENGTH and gen.failure is None
    finally:
        gen.close(timeout=10)


# ----------------------------------------------------------------------------- over the real engine, against the reference


def test_service_resolves_futures_as_reference_and_survives_cancel_and_failure(generator, reference_texts):
    docs, asked = engine_requests()
    engine = ContinuousEngine(generator, max_batch=4, kv_cache_tokens=2048, prefill_chunk=64)
    service = ContinuousGenerationService("generate", engine, max_queue=8)
    try:
        streams: list[list[int]] = [[], [], []]  # each answer's token ids, as a worker reads them
        futures = [service.submit(dataclasses.replace(r, on_token=ids.append)) for r, ids in zip(asked, streams)]
        victim = service.submit(asked[3])
        too_long = service.submit(GenerationRequest("x " * 3000, docs))  # over the KV-cache budget
        with pytest.raises(ValueError, match="budget"):
            too_long.result(timeout=120)
        # cancel mid-decode: wait until the victim has produced tokens, then cancel it
        def decoding() -> bool:
            assert not victim.done(), "the victim ended before it was cancelled"
            return any(s.payload.future is victim and len(s.generated) > 2 for s in engine.scheduler.running)

        wait_until(decoding, 60, "the victim never started decoding", poll_s=0.01)
        assert victim.cancel()
        assert all(f.result(timeout=300) in (Finish.EOS, Finish.LENGTH) for f in futures)
        assert [generator.completion(ids).text for ids in streams] == reference_texts[:3]
        stats = service.stats()
        # the victim was cancelled mid-decode, the over-long prompt failed
        assert stats.cancelled_sequences_total == 1 and stats.batching.failed_items_total == 1
        assert stats.finished_sequences_total == 3 and stats.max_step_sequences > 1
        assert sum(stats.ttft_bucket_counts) == 3
    finally:
        service.close(timeout=60)
