"""services/roles/gateway/role.py: node 0's /query over a real Gateway (with its reply cache) and a fake
worker, no models: through the one error handler (the request rules, a failure answered once,
readiness), a request_id's own answer over the reply cache, and streaming (the SSE events, the errors
before and after a stream starts)."""
from __future__ import annotations

import pytest

from services.roles.gateway.routing import WorkerTarget
from services.server import sse
from services.server.answer import AnswerPiece, FinalAnswer
from services.server.errors import (
    NoWorkerAvailable,
    Overloaded,
    RequestTimeout,
    StageFailed,
    WorkerFailed,
)
from tests.unit.test_gateway import gateway

pytestmark = pytest.mark.timeout(60)


class Outcomes:
    """A worker answering from a list of outcomes: a reply dict, or an exception to raise."""

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)

    def answer(self, request, deadline):
        """The next outcome as node 0's worker streams it: its answer word by word, then the reply with
        usage, naming the node."""
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        reply = {"sentiment": "neutral", "is_toxic": "false", **outcome, "request_id": request.request_id}
        words = reply["generated_response"].split(" ")
        yield from (AnswerPiece(word if i == 0 else f" {word}") for i, word in enumerate(words))
        yield FinalAnswer.from_wire({**reply, "usage": {"prompt_tokens": 40, "completion_tokens": len(words)},
                                     "finish_reason": "stop", "served_by": 0})


def query_app(outcomes, **env):
    """Node 0's /query over a real Gateway (with its reply cache) and one worker answering `outcomes`."""
    from pipeline.config import Settings
    from services.roles.gateway.role import GatewayRole
    from services.server.lifecycle import Lifecycle, Readiness
    from services.server.routes import build_app
    settings = Settings.from_env({"RESPONSE_CACHE_SIZE": "16", **env})
    lifecycle = Lifecycle("node 0", 0.0, exit=lambda code: None)
    role = GatewayRole(settings, 0, lifecycle)
    app = build_app(role, lifecycle)
    answers = Outcomes(outcomes)
    worker = WorkerTarget(node=0, answer=answers.answer, probe=lambda: True, local=True)
    role.gateway.set(gateway(worker, response_cache=role.response_cache))
    role.count_query_tokens = len  # no LLM tokenizer here: a character per token
    lifecycle.readiness.set(Readiness.READY)
    return role, app.test_client()


def test_a_query_over_max_query_tokens_gets_400_naming_query_and_the_limit():
    role, client = query_app([{"generated_response": "a"}], MAX_QUERY_TOKENS="16")
    r = client.post("/query", json={"request_id": "long", "query": "x" * 17})
    assert r.status_code == 400 and r.get_json()["field"] == "query"
    assert "17 tokens; the limit is 16 tokens (MAX_QUERY_TOKENS" in r.get_json()["error"]


def test_node_0_serves_no_internal_answer():
    role, client = query_app([])
    assert client.post("/internal/answer", json={"request_id": "i", "query": "q"}).status_code == 404


@pytest.mark.parametrize("error,status,body,retry_after", [
    (RequestTimeout("request timed out"), 504, {"error": "Request timeout"}, None),
    (NoWorkerAvailable("no worker could serve the request (down)"), 503,
     {"error": "no worker could serve the request (down)"}, "5"),
    (WorkerFailed(1, "HTTP 500: secret"), 500, {"error": "internal error on worker node 1"}, None),
    (Overloaded("the gateway is at capacity", retry_after_s=3), 503,
     {"error": "overloaded: the gateway is at capacity"}, "3"),
])
def test_query_failure_is_answered_once_and_fails_the_response_cache_claim(error, status, body, retry_after):
    reply = {"generated_response": "ok", "sentiment": "neutral", "is_toxic": "false"}
    role, client = query_app([error, reply])
    first = client.post("/query", json={"request_id": "a", "query": "Where is my order?"})
    assert (first.status_code, first.get_json(), first.headers.get("Retry-After")) == (status, body, retry_after)
    assert role.response_cache.in_flight() == 0  # failed: a repeat does not wait on a failure
    second = client.post("/query", json={"request_id": "b", "query": "where is my  order?"})
    assert second.status_code == 200 and second.get_json()["request_id"] == "b"


def test_query_refused_with_retry_after_while_not_ready():
    role, client = query_app([])
    role.lifecycle.readiness.set("starting")
    response = client.post("/query", json={"request_id": "a", "query": "q"})
    assert response.status_code == 503 and response.get_json() == {"error": "node 0 is starting"}
    assert response.headers["Retry-After"] == "5"


REPLY = {"generated_response": "ok", "sentiment": "neutral", "is_toxic": "false"}


def test_a_request_id_keeps_its_own_answer_over_the_reply_cache():
    role, client = query_app([{**REPLY, "generated_response": "first"}, {**REPLY, "generated_response": "second"}])
    first = client.post("/query", json={"request_id": "a", "query": "Where is my order?"})
    role.response_cache.clear()  # the reply cache forgets; the id does not
    other = client.post("/query", json={"request_id": "b", "query": "Where is my order?"})
    assert other.get_json()["generated_response"] == "second"
    again = client.post("/query", json={"request_id": "a", "query": "Where is my order?"})
    assert again.get_json() == first.get_json()  # not the reply cache's "second", nor marked cached
    assert role.gateway.require().stats()["cache_hits"] == 1


def test_a_request_id_with_another_query_gets_409_naming_the_query():
    role, client = query_app([REPLY, REPLY])
    assert client.post("/query", json={"request_id": "a", "query": "Refund?"}).status_code == 200
    assert client.post("/query", json={"request_id": "b", "query": "Shipping?"}).status_code == 200
    for query in ("Shipping?", "refund?", "Refund? "):  # a reply-cache hit, then exact text: case and spaces count
        r = client.post("/query", json={"request_id": "a", "query": query})
        assert r.status_code == 409 and r.get_json()["field"] == "query", r.get_json()
        assert "request_id" in r.get_json()["error"]
    assert client.post("/query", json={"request_id": "a", "query": "Refund?"}).status_code == 200
    assert role.gateway.require().stats()["conflicts"] == 3


HISTORY_A = [{"role": "user", "content": "Do you ship to Norway?"}, {"role": "assistant", "content": "Yes."}]
HISTORY_B = [{"role": "user", "content": "Can I return a laptop?"}, {"role": "assistant", "content": "Yes."}]


def test_two_conversations_ending_in_the_same_question_do_not_share_a_cached_reply():
    role, client = query_app([{**REPLY, "generated_response": "shipping"}, {**REPLY, "generated_response": "returns"},
                              {**REPLY, "generated_response": "alone"}])
    ask = lambda request_id, **fields: client.post(  # noqa: E731
        "/query", json={"request_id": request_id, "query": "and to Canada?", **fields}).get_json()
    assert ask("a", history=HISTORY_A)["generated_response"] == "shipping"
    assert ask("b", history=HISTORY_B)["generated_response"] == "returns"  # computed: not A's reply
    assert ask("c")["generated_response"] == "alone"  # nor is the question without a history
    hit = ask("d", history=HISTORY_A)  # the same conversation again: the reply cache's
    assert (hit["generated_response"], hit["cached"]) == ("shipping", True)
    assert role.response_cache.stats().hits == 1


def test_a_request_id_is_bound_to_its_whole_conversation():
    role, client = query_app([REPLY])
    assert client.post("/query", json={"request_id": "a", "query": "and to Canada?", "history": HISTORY_A}
                       ).status_code == 200
    for history in (HISTORY_B, HISTORY_A[:1], None):
        r = client.post("/query", json={"request_id": "a", "query": "and to Canada?", "history": history})
        assert r.status_code == 409, r.get_json()


def test_a_bad_history_on_query_is_a_400_naming_the_turn_and_the_rule():
    role, client = query_app([])
    r = client.post("/query", json={"request_id": "a", "query": "q", "history": [{"role": "system", "content": "x"}]})
    assert r.status_code == 400 and r.get_json()["field"] == "history[0].role"
    assert "must be one of user, assistant" in r.get_json()["error"]


# ----------------------------------------------------------------------------- streaming /query


ANSWER = {**REPLY, "generated_response": "Answer: return it within 30 days"}


def events(response) -> list[sse.SseEvent]:
    return list(sse.iter_events(response.get_data().splitlines(keepends=True)))


def test_query_with_stream_true_sends_pieces_then_the_reply_and_without_it_the_plain_reply():
    role, client = query_app([ANSWER, ANSWER])
    streamed = client.post("/query", json={"request_id": "s-1", "query": "Return?", "stream": True})
    assert streamed.status_code == 200 and streamed.headers["Content-Type"].startswith("text/event-stream")
    got = events(streamed)
    assert [e.name for e in got] == ["token"] * 6 + ["reply"]
    pieces = "".join(e.json()["text"] for e in got[:-1])
    reply = got[-1].json()
    assert pieces == reply["generated_response"] == ANSWER["generated_response"]
    assert (reply["request_id"], reply["sentiment"], reply["is_toxic"], reply["served_by"]) == ("s-1", "neutral",
                                                                                                  "false", 0)
    plain = client.post("/query", json={"request_id": "p-1", "query": "Return it?"})  # not the cached question
    assert plain.get_json() == {**ANSWER, "request_id": "p-1", "served_by": 0}


def test_a_streamed_reply_fills_the_reply_cache_and_a_hit_streams_as_one_piece_then_the_reply():
    role, client = query_app([ANSWER])  # one outcome: a second computation would fail the test
    first = events(client.post("/query", json={"request_id": "h-1", "query": "Return?", "stream": True}))
    hit = events(client.post("/query", json={"request_id": "h-2", "query": "return?", "stream": True}))
    assert [e.name for e in hit] == ["token", "reply"] and hit[0].json()["text"] == ANSWER["generated_response"]
    assert hit[-1].json()["cached"] is True and hit[-1].json()["request_id"] == "h-2"
    assert hit[-1].json()["generated_response"] == first[-1].json()["generated_response"]


def test_an_accept_header_asks_for_a_stream_too_and_a_bad_stream_flag_is_a_400():
    role, client = query_app([ANSWER])
    r = client.post("/query", json={"request_id": "a-1", "query": "Return?"}, headers={"Accept": "text/event-stream"})
    assert [e.name for e in events(r)][-1] == "reply"
    bad = client.post("/query", json={"request_id": "a-2", "query": "Return?", "stream": "yes"})
    assert bad.status_code == 400 and bad.get_json() == {"error": "'stream' must be true or false", "field": "stream"}


def test_a_stream_refused_before_its_first_token_gets_its_status_not_a_stream():
    role, client = query_app([Overloaded("the worker is full", retry_after_s=2)])
    r = client.post("/query", json={"request_id": "o-1", "query": "Return?", "stream": True})
    assert r.status_code == 503 and r.headers["Retry-After"] == "2"
    assert r.get_json() == {"error": "overloaded: the worker is full"}


def test_a_retried_request_id_streams_the_answer_it_got_and_is_not_recomputed():
    role, client = query_app([ANSWER])  # one outcome: a second computation would fail the test
    first = events(client.post("/query", json={"request_id": "r-1", "query": "Return?", "stream": True}))
    again = events(client.post("/query", json={"request_id": "r-1", "query": "Return?", "stream": True}))
    assert again[-1].json()["generated_response"] == first[-1].json()["generated_response"]
    assert "".join(e.json()["text"] for e in again[:-1]) == ANSWER["generated_response"]
    conflict = client.post("/query", json={"request_id": "r-1", "query": "Another question", "stream": True})
    assert conflict.status_code == 409


def failing_after_one_piece():
    """A gateway whose one target streams a piece, then fails in a later stage."""
    role, client = query_app([ANSWER])

    def failing(request, timeout_s):
        yield "Answer:"
        raise StageFailed("sentiment", RuntimeError("boom"))

    role.gateway.require().router.targets[0].answer = failing
    return client


def test_an_error_after_a_stream_started_is_its_last_event():
    client = failing_after_one_piece()
    got = events(client.post("/query", json={"request_id": "f-1", "query": "Return?", "stream": True}))
    assert [e.name for e in got] == ["token", "error"]
    assert got[-1].json()["status"] == 500


def test_a_stream_past_its_deadline_ends_with_a_504_error_event():
    from services.server.errors import RequestTimeout
    role, client = query_app([ANSWER])

    target = role.gateway.require().router.targets[0]
    worker = target.answer

    def slow(request, timeout_s):  # once: the retry below gets the worker's answer
        target.answer = worker
        yield "Answer:"
        raise RequestTimeout("request timed out")  # what TokenStream.read raises at the deadline

    target.answer = slow
    got = events(client.post("/query", json={"request_id": "d-1", "query": "Return?", "stream": True}))
    assert [e.name for e in got] == ["token", "error"]
    assert got[-1].json() == {"error": "Request timeout", "status": 504}
    retry = client.post("/query", json={"request_id": "d-1", "query": "Return?"})  # a failure is not kept
    assert retry.status_code == 200 and retry.get_json()["generated_response"] == ANSWER["generated_response"]
