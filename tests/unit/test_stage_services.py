"""The queue policy alone (injected clock), the one fail-what-is-queued path under
concurrency, the scheduler's plan/update with no model, and the generate stage's
statistics and metric families (a model-free engine on the real scheduler)."""
from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import CancelledError

import pytest
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families

from pipeline.continuous import ContinuousEngine, RunnerOutput, Scheduler, SlotRule, StepResult
from pipeline.continuous.output import Finish
from services.server.errors import Overloaded, ServiceClosed, StageDown
from services.server.metrics import NodeMetrics
from services.stages.batch_queue import BatchQueue
from services.stages.batching import BatchingService
from services.stages.continuous import ContinuousGenerationService, GenerationStats, GenerationTicket
from services.stages.metrics import StageCollector
from services.stages.protocol import StageService
from tests.helpers import ManualClock

# ----------------------------------------------------------------------------- queue policy


def test_window_starts_at_the_oldest_item_and_a_full_batch_goes_at_once():
    clock = ManualClock(100.0)
    q = BatchQueue("q", max_size=3, max_wait_ms=10, max_queue=10, clock=clock)
    assert q.due_in() is None
    q.put(["a"])
    clock.now += 0.004
    q.put(["b"])
    assert q.due_in() == pytest.approx(0.006)
    clock.now += 0.006
    assert q.due_in() == 0
    clock.now -= 0.006
    q.put(["c"])
    assert q.due_in() == 0  # full: no waiting on a full batch
    q.put(["d"])
    batch = q.take()
    assert [p.item for p in batch] == ["a", "b", "c"] and all(p.future.running() for p in batch)
    st = q.snapshot()
    assert st.batches_total == 1 and st.items_total == 3 and st.queue_depth == 1
    assert st.wait_seconds_sum == pytest.approx(0.004 + 0.0 + 0.0)


def test_cancelled_oldest_item_does_not_set_the_window_and_is_never_taken():
    clock = ManualClock(100.0)
    q = BatchQueue("q", max_size=4, max_wait_ms=10, max_queue=10, clock=clock)
    old = q.put(["old"])[0]
    clock.now += 0.008
    q.put(["new"])
    assert old.cancel()
    assert q.due_in() == pytest.approx(0.010)
    clock.now += 0.010
    assert [p.item for p in q.take()] == ["new"]
    assert q.snapshot().cancelled_items_total == 1


def test_closing_flushes_without_window_and_refuses_new_items():
    clock = ManualClock(100.0)
    q = BatchQueue("q", max_size=4, max_wait_ms=1000, max_queue=10, clock=clock)
    q.put([1, 2])
    q.close()
    assert q.due_in() == 0
    with pytest.raises(ServiceClosed):
        q.put([3])
    assert [p.item for p in q.next_batch()] == [1, 2]
    assert q.next_batch() is None  # closing and drained


def test_capacity_counts_busy_work_and_take_can_leave_futures_pending():
    q = BatchQueue("q", max_size=8, max_wait_ms=0, max_queue=3, clock=ManualClock(100.0))
    q.put([1])
    with pytest.raises(Overloaded) as info:
        q.put([2], busy=2, retry_after_s=lambda depth: 7.0)
    assert info.value.retry_after_s == 7.0
    batch = q.take(start_running=False)
    assert not batch[0].future.running() and batch[0].future.cancel()  # still the caller's to cancel


# ----------------------------------------------------------------------------- fail what is queued


@pytest.mark.timeout(60)
def test_concurrent_submit_and_close_resolve_every_future_exactly_once():
    release = threading.Event()

    def slow(items):
        release.wait(5)
        return items

    def one_round(round_: int) -> None:
            svc = BatchingService(f"stress-{round_}", slow, max_size=4, max_wait_ms=1, max_queue=10_000)
            accepted, endings, lock = [], [], threading.Lock()
            start = threading.Barrier(9)

            def on_done(future):
                with lock:
                    endings.append(future)

            def client():
                start.wait()
                for i in range(300):
                    try:
                        future = svc.submit(i)
                    except ServiceClosed:
                        return
                    future.add_done_callback(on_done)
                    with lock:
                        accepted.append(future)
                    if i % 7 == 0:
                        future.cancel()

            threads = [threading.Thread(target=client) for _ in range(8)]
            for t in threads:
                t.start()
            start.wait()
            svc.close(timeout=0.01)  # some items still queued: they fail with ServiceClosed
            release.set()
            for t in threads:
                t.join(30)
            svc.close(timeout=30)
            release.clear()
            assert all(f.done() for f in accepted)
            assert sorted(map(id, endings)) == sorted(map(id, accepted))  # each future ended once
            outcomes = {"result": 0, "closed": 0, "cancelled": 0}
            for f in accepted:
                try:
                    f.result(timeout=0)
                    outcomes["result"] += 1
                except ServiceClosed:
                    outcomes["closed"] += 1
                except CancelledError:
                    outcomes["cancelled"] += 1
            st = svc.stats()
            assert st.items_total == outcomes["result"] and st.failed_items_total == outcomes["closed"]
            assert st.cancelled_items_total == outcomes["cancelled"] and st.queue_depth == 0

    for round_ in range(5):
        one_round(round_)


# ----------------------------------------------------------------------------- scheduler, no model


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


# ----------------------------------------------------------------------------- generation stats and metrics


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


# ----------------------------------------------------------------------------- a stage thread that dies, abort


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


class Held:
    """A batch_fn that signals it has a batch (`entered`) and returns it once `gate` opens."""

    def __init__(self):
        self.gate, self.entered = threading.Event(), threading.Event()

    def __call__(self, items):
        self.entered.set()
        assert self.gate.wait(10)
        return items


@pytest.mark.timeout(30)
def test_batching_abort_fails_the_running_batch_and_the_queue_at_once():
    held = Held()
    gate, entered = held.gate, held.entered
    svc = BatchingService("search", held, max_size=1, max_wait_ms=0)
    running = svc.submit("a")
    assert entered.wait(10)
    queued = svc.submit("b")
    svc.abort("node 1 is stopping")
    for future in (running, queued):
        with pytest.raises(ServiceClosed, match="node 1 is stopping"):
            future.result(timeout=1)
    with pytest.raises(ServiceClosed):
        svc.submit("c")
    gate.set()  # batch_fn's late result finds its future failed: dropped, the thread ends
    svc.close(timeout=10)
    assert svc.failure is None


@pytest.mark.timeout(30)
def test_a_batching_worker_whose_cleanup_fails_dies_loudly_and_fails_what_it_holds(monkeypatch):
    fn = Held()
    gate, entered = fn.gate, fn.entered
    svc = BatchingService("rerank", fn, max_size=1, max_wait_ms=0)

    def broken(*_args):
        raise RuntimeError("bookkeeping failed")

    fail_held = svc._holdings.fail_held
    cleanups = []

    def cleanup_fails_once(make_error):  # the internal-error path's cleanup fails; the dying thread's works
        cleanups.append(make_error)
        if len(cleanups) == 1:
            broken()
        fail_held(make_error)

    monkeypatch.setattr(svc, "_run_batch", lambda batch: (fn(batch), broken()))  # a bug after batch_fn
    monkeypatch.setattr(svc._holdings, "fail_held", cleanup_fails_once)  # and its cleanup fails too
    running = svc.submit("a")
    assert entered.wait(10)
    queued = svc.submit("b")
    gate.set()
    for future in (running, queued):
        with pytest.raises(StageDown, match="rerank stage stopped: RuntimeError: bookkeeping failed"):
            future.result(timeout=10)
    assert svc.failure == "RuntimeError: bookkeeping failed"
    with pytest.raises(StageDown):
        svc.submit("c")
    svc.close(timeout=10)


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


def test_a_token_stream_reads_until_its_future_resolves_and_times_out_at_its_deadline():
    from concurrent.futures import Future

    from services.server.errors import RequestTimeout
    from services.stages.token_stream import TokenStream
    stream, future = TokenStream(), Future()
    stream.end_with(future)
    for token in (5, 6, 7):
        stream.put(token)
    future.set_result("done")
    assert list(stream.read(time.monotonic() + 5)) == [5, 6, 7]
    silent = TokenStream()
    silent.end_with(Future())
    started = time.monotonic()
    with pytest.raises(RequestTimeout):
        list(silent.read(started + 0.2))
    assert 0.15 < time.monotonic() - started < 2.0
