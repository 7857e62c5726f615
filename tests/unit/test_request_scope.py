"""Requests scoped to their API key: two callers (two keys' identities) share no request_id, no flight,
no completed reply and no reply-cache entry, so neither can detect (409) nor replay the other's
request; without keys (caller None) the rules are as they were. No models, no HTTP server."""
from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from services.roles.caches import ResponseCache
from services.roles.gateway.idempotency import request_digest
from services.server.answer import FinalAnswer
from services.server.answer_request import RULES, AnswerRequest
from services.server.auth import ApiKeys
from services.server.deadline import Deadline
from services.server.errors import RequestIdConflict
from services.server.stream_response import collect
from tests.helpers import wait_until
from tests.unit.test_gateway import FakeWorker, gateway
from tests.unit.test_gateway_role import REPLY, query_app

pytestmark = pytest.mark.timeout(60)

ALICE, BOB = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def ask(gw, caller: str | None, request_id: str, query: str, **fields) -> dict:
    return collect(gw.answer(AnswerRequest(request_id, query, caller=caller, **fields), Deadline.after(10))).wire()


# ---------------------------------------------------------------- the request object and the keys

def test_the_caller_is_no_body_field_is_never_sent_and_does_not_change_the_digest():
    mine, theirs = AnswerRequest("r", "q", caller=ALICE), AnswerRequest("r", "q", caller=BOB)
    assert "caller" not in RULES
    assert "caller" not in mine.wire() and mine.wire() == AnswerRequest("r", "q").wire()
    assert request_digest(mine) == request_digest(theirs) == request_digest(AnswerRequest("r", "q"))


def test_a_key_is_identified_by_its_digest_never_by_itself(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"alice-secret\nsha256:{hashlib.sha256(b'bob-secret').hexdigest()}\n")
    keys = ApiKeys.from_file(path)
    alice, bob = keys.identify("alice-secret"), keys.identify("bob-secret")
    assert alice and bob and alice != bob
    assert alice == "sha256:" + hashlib.sha256(b"alice-secret").hexdigest() and "alice-secret" not in alice
    assert keys.identify("alice-secret") == alice and keys.identify("mallory") is None


# ---------------------------------------------------------------- idempotency: completed and in flight

def test_the_same_request_id_from_two_callers_is_two_requests():
    worker = FakeWorker(0)
    gw = gateway(worker.target(local=True))
    mine = ask(gw, ALICE, "shared-id", "my question")
    assert ask(gw, BOB, "shared-id", "my question") == mine and len(worker.calls) == 2  # computed, not replayed
    with pytest.raises(RequestIdConflict):
        ask(gw, BOB, "shared-id", "another question")  # Bob's own id, bound to Bob's own query
    ask(gw, ALICE, "other-id", "q1")
    assert ask(gw, BOB, "other-id", "q2")["generated_response"] == "answer to q2"  # no 409: Alice's id is not Bob's
    assert ask(gw, ALICE, "shared-id", "my question") == mine and len(worker.calls) == 4  # her own replay
    assert ask(gw, None, "shared-id", "a third")["generated_response"] == "answer to a third"  # no keys: its own scope
    assert len(worker.calls) == 5 and gw.stats()["conflicts"] == 1


def test_a_request_id_another_caller_has_in_flight_is_neither_joined_nor_refused():
    gate = threading.Event()
    worker = FakeWorker(0, gate=gate)
    gw = gateway(worker.target(local=True), max_in_flight=4)
    with ThreadPoolExecutor(3) as pool:
        alices = pool.submit(ask, gw, ALICE, "busy-id", "q")
        wait_until(lambda: gw.stats()["in_flight"] == 1, 5, "never in_flight == 1")
        bobs_same = pool.submit(ask, gw, BOB, "busy-id", "q")  # leads its own computation
        wait_until(lambda: gw.stats()["in_flight"] == 2, 5, "never in_flight == 2")
        bobs_other = pool.submit(ask, gw, BOB, "busy-id", "q")  # joins Bob's, not Alice's
        wait_until(lambda: gw.stats()["joining"] == 1, 5, "never joining == 1")
        gate.set()
        replies = [f.result(timeout=10) for f in (alices, bobs_same, bobs_other)]
    assert all(r["generated_response"] == "answer to q" for r in replies)
    assert len(worker.calls) == 2 and gw.stats()["joined"] == 1 and gw.stats()["conflicts"] == 0


def test_another_callers_query_in_flight_under_the_same_id_is_no_conflict():
    gate = threading.Event()
    worker = FakeWorker(0, gate=gate)
    gw = gateway(worker.target(local=True))
    with ThreadPoolExecutor(2) as pool:
        alices = pool.submit(ask, gw, ALICE, "f", "q")
        wait_until(lambda: gw.stats()["in_flight"] == 1, 5, "never in_flight == 1")
        bobs = pool.submit(ask, gw, BOB, "f", "another q")
        wait_until(lambda: gw.stats()["in_flight"] == 2, 5, "never in_flight == 2")
        with pytest.raises(RequestIdConflict):
            ask(gw, ALICE, "f", "another q")  # Alice's own id in flight, another query: hers to know
        gate.set()
        assert alices.result(timeout=10)["generated_response"] == "answer to q"
        assert bobs.result(timeout=10)["generated_response"] == "answer to another q"


# ---------------------------------------------------------------- the reply cache

def test_the_reply_cache_answers_a_caller_only_with_its_own_replies():
    cache = ResponseCache(8, 0)
    worker = FakeWorker(0)
    gw = gateway(worker.target(local=True), response_cache=cache)
    ask(gw, ALICE, "a1", "Popular question")
    bobs = ask(gw, BOB, "b1", "popular  question")  # computed for Bob: no hit, not marked cached
    assert "cached" not in bobs and len(worker.calls) == 2
    alices_again = ask(gw, ALICE, "a2", "popular question")
    assert alices_again["cached"] is True and alices_again["request_id"] == "a2" and len(worker.calls) == 2
    assert ask(gw, None, "n1", "Popular question").get("cached") is None and len(worker.calls) == 3


def test_the_reply_cache_neither_hands_nor_joins_across_callers():
    cache = ResponseCache(8, 0)
    cache.put("Q", FinalAnswer("x", "alice's", "neutral", "false"), caller=ALICE)
    assert cache.get("y", "q", caller=BOB) is None and cache.get("y", "q") is None
    assert cache.get("y", "q", caller=ALICE) == FinalAnswer("y", "alice's", "neutral", "false", cached=True)
    leading = cache.enter("b1", "other", caller=ALICE)
    assert leading.leads
    assert cache.enter("b2", "Other", caller=BOB).leads  # Bob leads his own: no wait on Alice's
    assert cache.enter("b3", "other", caller=ALICE).joins
    assert cache.in_flight() == 2


# ---------------------------------------------------------------- through node 0's routes, with two keys

@pytest.fixture()
def two_keys(tmp_path):
    path = tmp_path / "keys"
    path.write_text("alice-secret\nbob-secret\n")
    return str(path)


def test_over_node_0s_routes_each_key_has_its_own_request_ids(two_keys):
    """The caller comes from the key the request was let in with: Bob's reuse of Alice's request_id
    is his own request (200 with his answer), never her reply nor a 409."""
    role, client = query_app([{**REPLY, "generated_response": "for alice"}, {**REPLY, "generated_response": "for bob"}],
                             API_KEYS_FILE=two_keys)
    alice, bob = ({"Authorization": f"Bearer {k}"} for k in ("alice-secret", "bob-secret"))
    first = client.post("/query", json={"request_id": "r", "query": "Refund?"}, headers=alice)
    assert first.status_code == 200 and first.get_json()["generated_response"] == "for alice"
    bobs = client.post("/query", json={"request_id": "r", "query": "Refund?"}, headers=bob)
    assert bobs.status_code == 200 and bobs.get_json()["generated_response"] == "for bob"
    assert "cached" not in bobs.get_json()
    conflict = client.post("/query", json={"request_id": "r", "query": "Shipping?"}, headers=alice)
    assert conflict.status_code == 409
    assert client.post("/query", json={"request_id": "r", "query": "Refund?"}, headers=alice).get_json() == \
        first.get_json()
