"""AbortableCalls: a caller of another node always gets one outcome, the call's or abort's."""
from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from services.cluster.abortable import AbortableCalls
from services.server.errors import NodeNotReady

pytestmark = pytest.mark.timeout(60)


def stopping() -> NodeNotReady:
    return NodeNotReady("node 0 is stopping; retry")


def test_a_call_gives_its_result_or_its_own_error():
    calls = AbortableCalls("t", 2)
    assert calls.call(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ValueError, match="bad"):
        calls.call(lambda: (_ for _ in ()).throw(ValueError("bad")))
    calls.close()


def test_abort_answers_a_stuck_caller_at_once_and_refuses_later_calls():
    calls, release, entered = AbortableCalls("t", 2), threading.Event(), threading.Event()
    outcome: list = []

    def stuck():
        entered.set()
        release.wait(10)  # a request on the wire: cannot be interrupted
        return "late"

    def caller():
        try:
            outcome.append(calls.call(stuck))
        except NodeNotReady as exc:
            outcome.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    assert entered.wait(10)
    assert calls.abort(stopping) == 1
    thread.join(5)
    assert not thread.is_alive() and isinstance(outcome[0], NodeNotReady)
    with pytest.raises(NodeNotReady):
        calls.call(lambda: "never runs")
    release.set()  # the late result finds its caller answered: dropped
    calls.close()


def test_the_call_runs_in_the_callers_context():
    var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
    var.set("req-7")
    calls = AbortableCalls("t", 1)
    assert calls.call(var.get) == "req-7"
    calls.close()


@pytest.mark.parametrize("seed", range(3))
def test_under_concurrent_calls_and_an_abort_every_caller_gets_exactly_one_outcome(seed):
    calls, gate = AbortableCalls("t", 8), threading.Event()
    callers, first_half = 64, threading.Barrier(33)

    def work(i: int) -> int:
        if i % 2:
            gate.wait(10)  # half are stuck until after the abort
        return i

    def caller(i: int):
        if i < 32:
            first_half.wait(10)
        try:
            return ("result", calls.call(work, i))
        except NodeNotReady:
            return ("aborted", i)

    with ThreadPoolExecutor(callers) as pool:
        futures = [pool.submit(caller, i) for i in range(callers)]
        first_half.wait(10)  # the first 32 callers are about to call
        aborted_waiting = calls.abort(stopping)
        gate.set()
        outcomes = [f.result(timeout=20) for f in futures]
    assert len(outcomes) == callers
    for kind, i in outcomes:
        assert kind in ("result", "aborted")
        if kind == "result":
            assert i in range(callers)
    assert sum(kind == "aborted" for kind, _ in outcomes) >= aborted_waiting
    calls.close()
