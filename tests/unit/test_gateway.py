"""The gateway's rules with fake workers: capacity, idempotency, failover, deadlines (no models, no HTTP)."""
from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.config import Settings
from pipeline.config.sections import GatewaySettings
from services.roles.gateway.gateway import Gateway
from services.roles.gateway.metrics import GatewayCollector
from services.roles.gateway.routing import WorkerTarget, numerics_differences, remote_target
from services.server.answer import AnswerPiece, FinalAnswer
from services.server.answer_request import AnswerRequest
from services.server.deadline import Deadline
from services.server.errors import (
    NodeUnreachable,
    NoWorkerAvailable,
    Overloaded,
    PeerFailed,
    PeerRejected,
    PeerRejectedToken,
    PeerTimedOut,
    PeerUnavailable,
    RequestTimeout,
    StageFailed,
    WorkerFailed,
)
from services.server.stream_response import collect
from tests.helpers import ManualClock, wait_until

pytestmark = pytest.mark.timeout(60)


class FakeWorker:
    """Counts computations; each call can be made to wait on a gate or to fail."""

    def __init__(self, node: int, *, gate: threading.Event | None = None, errors: list | None = None):
        self.node = node
        self.gate = gate
        self.errors = list(errors or [])
        self.calls: list[tuple[str, float]] = []
        self.lock = threading.Lock()

    def reply(self, request: AnswerRequest, deadline: Deadline) -> dict:
        with self.lock:
            self.calls.append((request.request_id, deadline.left()))
            error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error
        if self.gate is not None:
            assert self.gate.wait(10), "test gate never opened"
        return {"request_id": request.request_id, "generated_response": f"answer to {request.query}",
                "sentiment": "neutral", "is_toxic": "false", "served_by": self.node}

    def answer(self, request: AnswerRequest, deadline: Deadline):
        """Its text word by word, then the reply (errors come before any event), which names its node."""
        reply = self.reply(request, deadline)
        words = reply["generated_response"].split(" ")
        yield from (AnswerPiece(word if i == 0 else f" {word}") for i, word in enumerate(words))
        yield FinalAnswer.from_wire(reply)

    def target(self, *, up: bool = True, local: bool = False, probe=lambda: True) -> WorkerTarget:
        return WorkerTarget(node=self.node, answer=self.answer, probe=probe, up=up, local=local)


def ask(gw: Gateway, request_id: str, query: str, timeout_s: float, **fields) -> dict:
    """The gateway's final answer collected, as node 0's /query collects it for a plain reply (as JSON)."""
    return collect(gw.answer(AnswerRequest(request_id, query, **fields), Deadline.after(timeout_s))).wire()


def gateway_settings(**kwargs) -> GatewaySettings:
    """The gateway's section: its defaults, with Gateway's own names for the two idempotency knobs."""
    names = {"completed_cache_size": "idempotency_cache_size", "completed_ttl_s": "idempotency_ttl_s"}
    return dataclasses.replace(Settings.from_env({}).gateway, **{names.get(k, k): v for k, v in kwargs.items()})


def gateway(*targets: WorkerTarget, response_cache=None, **kwargs) -> Gateway:
    """A Gateway over `targets`, returned once its first probe round has put each target where its
    probe says (in the rotation or out)."""
    kwargs.setdefault("health_interval_s", 3600)  # the probe runs once, at construction
    said: dict[int, bool] = {}

    def watched(target: WorkerTarget):
        probe = target.probe

        def answer() -> bool:
            try:
                ok = bool(probe())
            except Exception:  # as the router takes a probe that raises
                ok = False
            said[id(target)] = ok
            return ok
        return answer

    for target in targets:
        target.probe = watched(target)
    gw = Gateway(list(targets), gateway_settings(**kwargs), response_cache=response_cache)
    wait_until(lambda: all(id(t) in said and t.up == said[id(t)] for t in targets), 10,
               "the gateway's first probe round did not end")
    return gw


def test_round_robin_alternates_between_ready_workers():
    a, b = FakeWorker(0), FakeWorker(1)
    gw = gateway(a.target(local=True), b.target())
    served = [ask(gw, f"rr-{i}", "q", 10)["served_by"] for i in range(6)]
    assert served in ([0, 1] * 3, [1, 0] * 3)


def test_same_id_from_20_threads_is_computed_once_and_then_cached():
    gate = threading.Event()
    worker = FakeWorker(0, gate=gate)
    gw = gateway(worker.target(local=True), max_in_flight=1, max_joiners_per_id=19, max_joiners=19)
    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(ask, gw, "same", "q", 10) for _ in range(20)]
        # All 20 have arrived: one computes, 19 join (joins use no capacity).
        wait_until(lambda: gw.stats()["joining"] == 19 and gw.stats()["in_flight"] == 1, 10,
                   f"not 1 computing and 19 joining: {gw.stats()}")
        gate.set()
        replies = [f.result(timeout=10) for f in futures]
    assert len(worker.calls) == 1
    assert all(r == replies[0] for r in replies)
    assert ask(gw, "same", "q", 10) == replies[0] and len(worker.calls) == 1  # from the cache
    stats = gw.stats()
    assert stats["joined"] == 19 and stats["cache_hits"] == 1 and stats["in_flight"] == 0


def test_beyond_max_in_flight_is_refused_at_once_with_retry_after():
    gate = threading.Event()
    worker = FakeWorker(0, gate=gate)
    gw = gateway(worker.target(local=True), max_in_flight=2)
    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(ask, gw, f"busy-{i}", "q", 10) for i in range(2)]
        wait_until(lambda: gw.stats()["in_flight"] == 2, 10, "the two requests never held both slots")
        started = time.monotonic()
        with pytest.raises(Overloaded) as err:
            ask(gw, "one-too-many", "q", 10)
        assert time.monotonic() - started < 0.1
        assert err.value.retry_after_s >= 1
        gate.set()
        assert all(f.result(timeout=10)["request_id"].startswith("busy") for f in running)
    assert ask(gw, "one-too-many", "q", 10)["request_id"] == "one-too-many"  # capacity is back
    assert gw.stats()["rejected"] == 1


def test_failures_are_not_cached():
    worker = FakeWorker(0, errors=[StageFailed("generate", RuntimeError("boom"))])
    gw = gateway(worker.target(local=True))
    with pytest.raises(WorkerFailed):
        ask(gw, "flaky", "q", 10)
    assert ask(gw, "flaky", "q", 10)["request_id"] == "flaky"
    assert len(worker.calls) == 2


def test_cache_is_bounded_in_size_and_time(monkeypatch):
    worker = FakeWorker(0)
    gw = gateway(worker.target(local=True), completed_cache_size=3, completed_ttl_s=0.3)
    clock = ManualClock(100.0)
    monkeypatch.setattr(gw.completed, "_clock", clock)  # the completed replies' age, moved by hand
    for i in range(5):
        ask(gw, f"c-{i}", "q", 10)
    assert gw.stats()["cached"] == 3
    ask(gw, "c-4", "q", 10)
    assert len(worker.calls) == 5  # c-4 came from the cache
    ask(gw, "c-0", "q", 10)
    assert len(worker.calls) == 6  # c-0 had been evicted
    clock.now += 0.35
    ask(gw, "c-4", "q", 10)
    assert len(worker.calls) == 7  # expired
    assert gw.stats()["cached"] == 1  # the expired ones were dropped


def test_unreachable_worker_leaves_rotation_and_another_serves():
    local, remote = FakeWorker(0), FakeWorker(1, errors=[NodeUnreachable("refused")])
    remote_target_ = remote.target(probe=lambda: False)
    gw = gateway(local.target(local=True), remote_target_)
    remote_target_.up = True  # as if it had been healthy until now
    served = {ask(gw, f"u-{i}", "q", 10)["served_by"] for i in range(4)}
    assert served == {0}
    assert not remote_target_.up and len(remote.calls) == 1


@pytest.mark.parametrize("error,expected", [
    (PeerUnavailable("node 1 is starting"), None),  # nothing computed: the other worker serves
    (PeerRejectedToken("missing or wrong X-Cluster-Token"), None),  # a misconfigured node: use the other
    (Overloaded("full"), None),
    (PeerFailed(500, "internal error"), WorkerFailed),  # this request fails alone
    (PeerRejected(400, "bad request"), WorkerFailed),  # so does one it refused
    (PeerTimedOut("Request timeout"), RequestTimeout),  # its 504
    (PeerTimedOut("worker at node 1 did not answer within 9.0s"), RequestTimeout),  # our read timeout
    (TimeoutError("read timeout"), RequestTimeout),
])
def test_worker_errors_map_to_one_answer(error, expected):
    first, second = FakeWorker(1, errors=[error]), FakeWorker(0)
    first_target = first.target()
    gw = gateway(first_target, second.target(local=True))
    gw.router._turn = iter(range(0, 1000, 2))  # always start with the first target
    if expected is None:
        assert ask(gw, "e", "q", 10)["served_by"] == 0
    else:
        with pytest.raises(expected):
            ask(gw, "e", "q", 10)
    if isinstance(error, (PeerRejectedToken, PeerUnavailable)):
        assert not first_target.up  # refused us or not ready: out of the rotation until the probe sees it ready
    if isinstance(error, (PeerFailed, PeerRejected)) and not isinstance(error, PeerRejectedToken):
        assert first_target.up  # it answered: the error is this request's alone, the worker stays in rotation


def test_a_worker_failing_mid_answer_is_failed_over_unless_the_caller_read_pieces_of_it():
    def breaks(request, deadline):
        yield "partial"
        raise NodeUnreachable("the stream broke")

    first, second = WorkerTarget(node=1, answer=breaks, probe=lambda: True), FakeWorker(0)
    gw = gateway(first, second.target(local=True))
    gw.router._turn = iter(range(0, 1000, 2))  # always start with the first target
    reply = ask(gw, "m-1", "q", 10)  # a plain reply: nobody read the partial answer
    assert reply["served_by"] == 0 and reply["generated_response"] == "answer to q" and not first.up
    first.up = True
    streamed: list = []
    with pytest.raises(NodeUnreachable):  # a streamed one: "partial" was read, and cannot be taken back
        streamed.extend(gw.answer(AnswerRequest("m-2", "q", stream=True), Deadline.after(10)))
    assert streamed == [AnswerPiece("partial")] and len(second.calls) == 1


def test_no_worker_available_when_all_fail_to_take_it():
    a = FakeWorker(0, errors=[NodeUnreachable("down")])
    b = FakeWorker(1, errors=[PeerUnavailable("stopping")])
    gw = gateway(a.target(), b.target())
    with pytest.raises(NoWorkerAvailable):
        ask(gw, "n", "q", 10)


def test_remaining_deadline_is_passed_on_and_enforced():
    worker = FakeWorker(0)
    gw = gateway(worker.target(local=True))
    ask(gw, "d", "q", 7.5)
    assert 7.0 < worker.calls[0][1] <= 7.5
    with pytest.raises(RequestTimeout):
        ask(gw, "late", "q", 0.0)


def test_remote_worker_is_out_of_rotation_until_its_probe_says_ready():
    class Client:
        ready = False

        def answer(self, request, timeout_s):  # a WorkerClient is given the time left
            return FakeWorker(1).answer(request, Deadline.after(timeout_s))

        def health(self):
            return {"status": "healthy"} if self.ready else None

        def abort(self, make_error):
            raise AssertionError("not abandoned in this test")

    client, local = Client(), FakeWorker(0)
    remote = remote_target(1, client)
    gw = gateway(local.target(local=True), remote, health_interval_s=0.05)
    assert {ask(gw, f"p-{i}", "q", 10)["served_by"] for i in range(4)} == {0}
    client.ready = True
    wait_until(lambda: remote.up, 10, "the probe never found node 1 ready")
    assert {ask(gw, f"q-{i}", "q", 10)["served_by"] for i in range(4)} == {0, 1}
    gw.close()


NUMERICS = {"torch": "2.13.0+cpu", "stages": {"generate": "cpu/bfloat16", "rerank": "cpu/bfloat16"},
            "cpu_decode_attention": "ordered"}


def test_numerics_differences_name_each_nested_key_that_differs_or_is_missing():
    other = {**NUMERICS, "stages": {"generate": "cpu/float32", "rerank": "cpu/bfloat16"}, "onednn_isa": "AVX2"}
    assert numerics_differences(NUMERICS, NUMERICS) == {}
    assert numerics_differences(NUMERICS, other) == {"onednn_isa": {"here": None, "there": "AVX2"},
                                                     "stages.generate": {"here": "cpu/bfloat16", "there": "cpu/float32"}}


def test_a_worker_computing_with_other_numerics_is_named_and_warned_about_once_but_still_served(caplog):
    class Client:
        numerics = {**NUMERICS, "cpu_decode_attention": "flash-chunks"}

        def answer(self, request, timeout_s):
            return FakeWorker(1).answer(request, Deadline.after(timeout_s))

        def health(self):
            return {"status": "healthy", "numerics": self.numerics}

        def abort(self, make_error):
            raise AssertionError("not abandoned in this test")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "other numerics" in r.getMessage()]

    client, local = Client(), FakeWorker(0)
    here = dataclasses.replace(local.target(local=True), numerics=NUMERICS)
    caplog.set_level("WARNING", logger="services.roles.gateway.routing")
    gw = gateway(here, remote_target(1, client))
    wait_until(warnings, 10, "no warning of node 1's numerics")  # the first probe round's, from the gateway's thread
    gw.router.probe_once()  # a second look at the same numerics: no second warning
    status = {w["node"]: w for w in gw.status()}
    assert status[1]["up"] and status[0]["numerics_differ"] == {}
    assert status[1]["numerics_differ"] == {"cpu_decode_attention": {"here": "ordered", "there": "flash-chunks"}}
    assert len(warnings()) == 1 and "cpu_decode_attention: here ordered, there flash-chunks" in warnings()[0]
    differ = next(f for f in GatewayCollector(lambda: gw).collect() if f.name == "rag_gateway_worker_numerics_differ")
    assert {s.labels["worker"]: s.value for s in differ.samples} == {"0": 0, "1": 1}
    assert {ask(gw, f"n-{i}", "q", 10)["served_by"] for i in range(4)} == {0, 1}  # still in the rotation
    client.numerics = NUMERICS  # rebuilt alike
    gw.router.probe_once()
    assert {w["node"]: w["numerics_differ"] for w in gw.status()}[1] == {}
    gw.close()


def test_the_completed_cache_keeps_a_hash_of_the_query_not_its_text():
    gw = gateway(FakeWorker(0).target(local=True))
    ask(gw, "h", "my card number is 4111", 10)
    digest, reply = gw.completed.get((None, "h"))  # (caller, request_id): no API keys here
    assert len(digest) == 64 and "4111" not in digest and reply.request_id == "h"


def test_a_joiner_with_another_query_gets_409_and_the_computation_is_untouched():
    from services.server.errors import RequestIdConflict
    gate = threading.Event()
    worker = FakeWorker(0, gate=gate)
    gw = gateway(worker.target(local=True))
    with ThreadPoolExecutor(1) as pool:
        owner = pool.submit(ask, gw, "f", "q", 10)
        wait_until(lambda: gw.stats()["in_flight"] == 1, 5, "the owner never took its slot")
        with pytest.raises(RequestIdConflict):
            ask(gw, "f", "another q", 10)
        gate.set()
        assert owner.result(timeout=10)["generated_response"] == "answer to q"
    assert len(worker.calls) == 1 and gw.stats()["joined"] == 0


def test_joiners_are_capped_per_id_and_in_all_with_an_immediate_503():
    gate = threading.Event()
    worker = FakeWorker(0, gate=gate)
    gw = gateway(worker.target(local=True), max_joiners_per_id=2, max_joiners=3)
    with ThreadPoolExecutor(5) as pool:
        owners = [pool.submit(ask, gw, rid, "q", 10) for rid in ("x", "y")]
        wait_until(lambda: gw.stats()["in_flight"] == 2, 5, "the owners never took their slots")
        joiners = [pool.submit(ask, gw, "x", "q", 10) for _ in range(2)]
        wait_until(lambda: gw.stats()["joining"] == 2, 5, "the two joiners never joined")
        for rid, cap in (("x", "2 per request_id"), ("y", None)):
            if cap is None:  # y's one joiner fills the total of 3
                joiners.append(pool.submit(ask, gw, "y", "q", 10))
                wait_until(lambda: gw.stats()["joining"] == 3, 5, "y's joiner never joined")
                rid, cap = "y", "3 in all"
            started = time.monotonic()
            with pytest.raises(Overloaded, match=cap) as err:
                ask(gw, rid, "q", 10)
            assert time.monotonic() - started < 0.1 and err.value.retry_after_s >= 1
        gate.set()
        assert all(f.result(timeout=10)["generated_response"] == "answer to q" for f in owners + joiners)
    stats = gw.stats()
    assert (stats["joined"], stats["joining"], stats["rejected_joiners"], stats["rejected"]) == (3, 0, 2, 2)
    assert len(worker.calls) == 2


def test_a_reply_cache_hit_becomes_the_new_ids_answer_and_takes_no_capacity():
    from services.roles.caches import ResponseCache
    gate = threading.Event()
    gate.set()
    worker = FakeWorker(0, gate=gate)
    gw = gateway(worker.target(local=True), max_in_flight=1, response_cache=ResponseCache(8, 0))
    ask(gw, "a", "popular", 10)
    gate.clear()
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(ask, gw, "b", "slow one", 10)
        wait_until(lambda: gw.stats()["in_flight"] == 1, 5, "b never took the slot")  # the gateway is full
        reply = ask(gw, "c", "Popular", 10)
        assert reply["request_id"] == "c" and reply["cached"] is True
        assert ask(gw, "c", "Popular", 10) == reply  # now c's own answer, from the id cache
        gate.set()
        busy.result(timeout=10)
    assert len(worker.calls) == 2 and gw.stats()["rejected"] == 0


def test_each_new_question_is_one_reply_cache_lookup():
    # The gateway looks the question up before it takes a slot and again, under the cache's
    # own lock, when it claims the computation: that is one lookup, one miss, not two.
    from services.roles.caches import ResponseCache
    cache = ResponseCache(8, 0)
    gw = gateway(FakeWorker(0).target(local=True), response_cache=cache)
    for i, question in enumerate(["one", "two", "One", "three", "two"]):
        ask(gw, f"r{i}", question, 10)
    stats = cache.stats()
    assert (stats.hits, stats.misses) == (2, 3)


def test_abort_answers_a_request_waiting_on_a_remote_worker_and_stops_failover():
    """Past the node's grace: the remote call is answered at once with the node's error, and a
    request its own worker fails next (its stages aborted) is not sent to another worker."""
    from services.cluster.abortable import AbortableCalls
    from services.server.errors import NodeNotReady, ServiceClosed

    gate, calls = threading.Event(), AbortableCalls("t", 4)
    remote = FakeWorker(1, gate=gate)
    local = FakeWorker(0, errors=[ServiceClosed("stage service 'embed' stopped")])

    def remote_answer(request, deadline):  # its reply waited on as a WorkerClient waits: abortable
        yield calls.call(remote.reply, request, deadline)

    target = dataclasses.replace(remote.target(), answer=remote_answer, abort=calls.abort)
    gw = gateway(target, local.target(local=True))
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(ask, gw, "ab-1", "q", 30)
        wait_until(lambda: remote.calls, 10, "ab-1 never reached node 1")
        gw.abort(lambda: NodeNotReady("node 0 is stopping; retry"))
        with pytest.raises(NodeNotReady, match="stopping"):
            waiting.result(timeout=5)
    with pytest.raises(NodeNotReady):  # its own worker stopped: no failover to node 1
        ask(gw, "ab-2", "q", 30)
    assert [c[0] for c in local.calls] in ([], ["ab-2"]) and [c[0] for c in remote.calls] == ["ab-1"]
    gate.set()
    gw.close()
