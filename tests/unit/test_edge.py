"""The one route edge (services/server/edge.py) on node 0's and a worker's apps, over a real Gateway and
fake workers (no models): every answering route enters by it; one completion line per request with
served_by and stage times, streamed or not; the deadline made once; the error shape chosen by route;
/v1/embeddings under the gateway's admission; what /v1 refuses; /settings for operators only."""
from __future__ import annotations

import dataclasses
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline import spec
from pipeline.config import Settings
from services.roles.gateway.routing import WorkerTarget
from services.server import sse
from services.server.deadline import Deadline
from services.server.edge import EDGE_ROUTE
from services.server.lifecycle import Lifecycle
from services.server.routes import build_app
from services.server.token import TOKEN_HEADER
from tests.helpers import wait_until
from tests.unit.test_gateway import gateway
from tests.unit.test_gateway_role import REPLY, Outcomes, query_app

pytestmark = pytest.mark.timeout(60)

CHAT = {"model": spec.GENERATOR_MODEL, "messages": [{"role": "user", "content": "How do I return an item?"}]}
TEXT = {"model": spec.GENERATOR_MODEL, "prompt": "How do I return an item?"}
EMBED = {"model": spec.EMBEDDER_MODEL, "input": ["How do I return an item?", "refunds"]}
ANSWERING = ("/query", "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank", "/v1/moderations",
             "/tokenize", "/detokenize")
STAGES = {"embed": 1.5, "generate": 20.0}


class WorkerOfNode1:
    """A worker as node 1's edge answers a forward: the reply names its node and carries its stage times."""

    def __init__(self, gate: threading.Event | None = None):
        self.gate = gate
        self.deadlines: list[Deadline] = []
        self.outcomes = Outcomes([])

    def answer(self, request, deadline):
        self.deadlines.append(deadline)
        if self.gate is not None:
            assert self.gate.wait(10), "test gate never opened"
        yield "Answer:"
        yield " ok"
        yield {"request_id": request.request_id, "generated_response": "Answer: ok", "sentiment": "neutral",
               "is_toxic": "false", "usage": {"prompt_tokens": 40, "completion_tokens": 2}, "finish_reason": "stop",
               "served_by": 1, "stages_ms": dict(STAGES)}


class EmbeddingWorker:
    """What node 0's own worker is asked for /v1/embeddings."""

    def __init__(self, gate: threading.Event | None = None):
        self.gate = gate
        self.calls: list[tuple[list[str], Deadline]] = []

    def embed(self, texts, deadline):
        self.calls.append((texts, deadline))
        if self.gate is not None:
            assert self.gate.wait(10), "test gate never opened"
        return [np.full(spec.EMBED_DIM, 0.5, dtype=np.float32) for _ in texts]


def node_0(worker: WorkerOfNode1, embedder: EmbeddingWorker | None = None, max_in_flight: int = 8, **env):
    role, client = query_app([], **env)
    target = WorkerTarget(node=1, answer=worker.answer, probe=lambda: True)
    role.gateway.set(gateway(target, response_cache=role.response_cache, max_in_flight=max_in_flight))
    role.worker_role.worker.set(embedder or EmbeddingWorker())  # type: ignore[arg-type]
    return role, client


def lines(caplog) -> list[dict]:
    return [r.fields for r in caplog.records if r.name == "services.requests"]


def test_every_answering_route_enters_by_the_edge_on_node_0_and_on_a_worker():
    role, client = query_app([])
    app = client.application
    edge_routes = {r.rule for r in app.url_map.iter_rules() if getattr(app.view_functions[r.endpoint], EDGE_ROUTE, False)}
    assert edge_routes == set(ANSWERING)
    from services.roles.worker.role import WorkerRole
    settings = Settings.from_env({})
    lifecycle = Lifecycle("node 1", 0.0, exit=lambda code: None)
    worker_app = build_app(WorkerRole(settings, 1, lifecycle), lifecycle)
    assert getattr(worker_app.view_functions["edge_internal_answer"], EDGE_ROUTE) is True
    assert worker_app.view_functions["edge_internal_answer"].cluster_internal is True


def test_each_public_request_writes_one_completion_line_with_served_by_and_stages_streamed_or_not(caplog):
    worker = WorkerOfNode1()
    role, client = node_0(worker)
    def chat(question: str) -> dict:
        return {**CHAT, "messages": [{"role": "user", "content": question}]}

    asks = [("/query", {"request_id": "q-1", "query": "Return?"}),
            ("/query", {"request_id": "q-2", "query": "Refund?", "stream": True}),
            ("/v1/chat/completions", chat("Shipping?")), ("/v1/chat/completions", {**chat("Billing?"), "stream": True}),
            ("/v1/completions", {**TEXT, "prompt": "Warranty?"}),
            ("/v1/completions", {**TEXT, "prompt": "Payment?", "stream": True})]
    with caplog.at_level(logging.INFO, logger="services.requests"):
        for n, (path, body) in enumerate(asks):
            response = client.post(path, json=body)
            data = response.get_data(as_text=True)
            response.close()  # as the server closes it once sent
            assert response.status_code == 200 and " ok" in data and "stages_ms" not in data, data
            assert len(lines(caplog)) == n + 1, path  # one line, once the response (a stream: all of it) is done
        embedded = client.post("/v1/embeddings", json=EMBED)
        assert embedded.status_code == 200 and len(embedded.get_json()["data"]) == 2
    got = lines(caplog)
    assert [line["endpoint"] for line in got] == [path for path, _ in asks] + ["/v1/embeddings"]
    for line in got[:-1]:
        assert (line["status"], line["served_by"], line["stages_ms"]) == (200, 1, STAGES), line
    assert (got[-1]["status"], got[-1]["served_by"]) == (200, 0)  # node 0's own worker embeds
    plain = client.post("/query", json={"request_id": "q-3", "query": "Returns?"}).get_json()
    assert plain["served_by"] == 1 and "stages_ms" not in plain and "usage" not in plain
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="services.requests"):  # a reply-cache hit computes nothing
        assert client.post("/v1/chat/completions", json=chat("Shipping?")).status_code == 200
    assert [(line["served_by"], line["stages_ms"]) for line in lines(caplog)] == [(1, {})]


def test_a_refused_or_failed_request_writes_its_line_too(caplog):
    role, client = node_0(WorkerOfNode1())
    with caplog.at_level(logging.INFO, logger="services.requests"):
        assert client.post("/query", json={"request_id": "r-1"}).status_code == 400
        assert client.post("/v1/chat/completions", json={**CHAT, "min_p": 0.2}).status_code == 400
    assert [(line["endpoint"], line["status"], line["served_by"]) for line in lines(caplog)] == \
        [("/query", 400, None), ("/v1/chat/completions", 400, None)]


def test_the_deadline_is_made_once_at_the_edge_and_passed_down_as_it_is():
    worker = WorkerOfNode1()
    embedder = EmbeddingWorker()
    role, client = node_0(worker, embedder, REQUEST_TIMEOUT_S="50")
    assert client.post("/query", json={"request_id": "d-1", "query": "Return?"}).status_code == 200
    assert client.post("/v1/embeddings", json=EMBED).status_code == 200
    for deadline in (worker.deadlines[0], embedder.calls[0][1]):
        assert isinstance(deadline, Deadline) and 45 < deadline.left() <= 50


def test_errors_take_the_shape_of_their_route_naming_the_field_as_its_body_does():
    role, client = node_0(WorkerOfNode1(), MAX_QUERY_TOKENS="16")
    query = client.post("/query", json={"request_id": "e-1", "query": "x" * 17})
    assert query.status_code == 400 and query.get_json()["field"] == "query" and "x-should-retry" not in query.headers
    for path, body, param in (("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x" * 17}]},
                               "messages"),
                              ("/v1/completions", {**TEXT, "prompt": "x" * 17}, "prompt"),
                              ("/v1/embeddings", {**EMBED, "input": "x" * 17}, "input"),
                              ("/v1/embeddings", {**EMBED, "input": ["ok", "x" * 17]}, "input[1]")):
        response = client.post(path, json=body)
        error = response.get_json()["error"]
        assert response.status_code == 400 and response.headers["x-should-retry"] == "false", path
        assert (error["param"], error["type"]) == (param, "invalid_request_error") and "MAX_QUERY_TOKENS" in \
            error["message"], path
    missing = client.post("/v1/nowhere", json={})
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "not_found"


def test_embeddings_take_a_slot_of_the_gateways_admission_and_a_query_takes_one_from_them():
    gate = threading.Event()
    embedder = EmbeddingWorker(gate)
    role, client = node_0(WorkerOfNode1(gate), embedder, max_in_flight=1)
    with ThreadPoolExecutor(1) as pool:
        embedding = pool.submit(client.post, "/v1/embeddings", json=EMBED)
        wait_until(lambda: embedder.calls, 5, "the embedding never reached the embedder")
        assert role.gateway.require().stats()["in_flight"] == 1
        refused = client.post("/query", json={"request_id": "a-1", "query": "Return?"})
        assert refused.status_code == 503 and "capacity" in refused.get_json()["error"]
        gate.set()
        assert embedding.result(timeout=10).status_code == 200
    gate.clear()
    with ThreadPoolExecutor(1) as pool:
        answering = pool.submit(client.post, "/query", json={"request_id": "a-2", "query": "Return?"})
        wait_until(lambda: role.gateway.require().stats()["in_flight"] == 1, 5, "the query never took its slot")
        full = client.post("/v1/embeddings", json=EMBED)
        assert full.status_code == 503 and full.headers["x-should-retry"] == "true" and "Retry-After" in full.headers
        gate.set()
        assert answering.result(timeout=10).status_code == 200
    assert role.gateway.require().stats()["in_flight"] == 0 and len(embedder.calls) == 1


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "function", "content": "42"}, *CHAT["messages"]]},
     "messages[0].role"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "tool", "content": "42", "tool_calls": []},
                                                  *CHAT["messages"]]}, "messages[0].tool_calls"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "min_p": 0.05}, "min_p"),
    ("/v1/chat/completions", {**CHAT, "repetition_penalty": 1.2}, "repetition_penalty"),
    ("/v1/chat/completions", {**CHAT, "guided_json": {"type": "object"}}, "guided_json"),
    ("/v1/chat/completions", {**CHAT, "frobnicate": True}, "frobnicate"),
    ("/v1/completions", {**TEXT, "logit_bias": {"42": 1}}, "logit_bias"),
    ("/v1/completions", {**TEXT, "best_of": 2}, "best_of"),
    ("/v1/embeddings", {**EMBED, "frobnicate": True}, "frobnicate"),
])
def test_what_v1_would_not_act_on_is_a_400_naming_it(path, body, param):
    role, client = node_0(WorkerOfNode1())
    response = client.post(path, json=body)
    assert response.status_code == 400, response.get_data()
    assert response.get_json()["error"]["param"] == param and "not supported" in response.get_json()["error"]["message"]


class ConversationWorker(WorkerOfNode1):
    """A worker that keeps the requests it is sent and says it left the oldest turn out."""

    def __init__(self):
        super().__init__()
        self.requests: list = []

    def answer(self, request, deadline):
        self.requests.append(request)
        for event in super().answer(request, deadline):
            yield {**event, "history_turns_dropped": 1} if isinstance(event, dict) else event


def test_a_chat_reaches_the_worker_as_its_question_history_and_instructions_and_says_what_was_dropped():
    from pipeline.conversation import Turn
    worker = ConversationWorker()
    role, client = node_0(worker)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "My order is late."},
                {"role": "assistant", "content": "Its number?"}, {"role": "user", "content": "ABC123"}]
    plain = client.post("/v1/chat/completions", json={**CHAT, "messages": messages})
    assert plain.status_code == 200 and plain.get_json()["usage"]["history_turns_dropped"] == 1
    asked = worker.requests[0]
    assert (asked.query, asked.instructions) == ("ABC123", "Be brief.")
    assert asked.history == (Turn("user", "My order is late."), Turn("assistant", "Its number?"))
    streamed = client.post("/v1/chat/completions", json={**CHAT, "messages": messages, "stream": True,
                                                         "stream_options": {"include_usage": True}})
    chunks = [e.json() for e in sse.iter_events(streamed.get_data().splitlines(keepends=True)) if e.data != "[DONE]"]
    usage = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    assert usage[-1]["history_turns_dropped"] == 1
    query = client.post("/query", json={"request_id": "q-1", "query": "ABC123", "history": messages[1:3]})
    assert query.status_code == 200 and query.get_json()["history_turns_dropped"] == 1
    assert worker.requests[-1].history == asked.history and worker.requests[-1].instructions is None


def test_query_refuses_a_field_it_does_not_read_by_name_and_v1_accepts_the_documented_ones():
    worker = WorkerOfNode1()
    role, client = node_0(worker)
    refused = client.post("/query", json={"request_id": "u-1", "query": "Return?", "temperature": 0.5})
    assert refused.status_code == 400 and refused.get_json()["field"] == "temperature"
    contract = [{"role": "system", "content": spec.SYSTEM_PROMPT}, *CHAT["messages"]]
    for body in ({**CHAT, "messages": contract, "user": "u-42", "min_p": 0, "n": 1, "logit_bias": None},
                 {**TEXT, "user": "u-42", "echo": False, "best_of": 1}):
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        assert client.post(path, json=body).status_code == 200, path


def test_a_completions_stream_is_text_completion_chunks_then_done():
    role, client = node_0(WorkerOfNode1())
    response = client.post("/v1/completions", json={**TEXT, "stream": True, "stream_options": {"include_usage": True}})
    got = list(sse.iter_events(response.get_data().splitlines(keepends=True)))
    assert got[-1].data == "[DONE]"
    objects = [event.json() for event in got[:-1]]
    assert all(obj["object"] == "text_completion" for obj in objects)
    assert "".join(obj["choices"][0]["text"] for obj in objects if obj["choices"]) == "Answer: ok"
    assert objects[-1]["choices"] == [] and objects[-1]["usage"]["completion_tokens"] == 2


def test_settings_answer_on_loopback_or_with_the_cluster_token_only():
    role, client = query_app([REPLY], CLUSTER_TOKEN="s3cret-token-for-tests")
    assert client.get("/settings").status_code == 200  # the test client is 127.0.0.1
    away = {"REMOTE_ADDR": "10.1.2.3"}
    refused = client.get("/settings", environ_base=away)
    assert refused.status_code == 403 and refused.get_json()["field"] == TOKEN_HEADER
    assert client.get("/settings", environ_base=away, headers={TOKEN_HEADER: "wrong"}).status_code == 403
    allowed = client.get("/settings", environ_base=away, headers={TOKEN_HEADER: "s3cret-token-for-tests"})
    assert allowed.status_code == 200 and "settings" in allowed.get_json()
    assert client.get("/settings", environ_base={"REMOTE_ADDR": "::1"}).status_code == 200
    _role, open_client = query_app([REPLY])  # no token configured: this machine only
    assert open_client.get("/settings", environ_base=away).status_code == 403


def test_answers_sent_whole_count_their_prompt_tokens_and_finish_reason_streamed_or_not():
    def scraped(client) -> dict:
        text = client.get("/metrics").get_data(as_text=True)
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples
                if s.name in ("rag_prompt_tokens_total", "rag_request_success_total")}

    role, client = query_app([])  # node 0's own worker left unloaded: /metrics then reports no stages of it
    target = WorkerTarget(node=1, answer=WorkerOfNode1().answer, probe=lambda: True)
    role.gateway.set(gateway(target, response_cache=role.response_cache))
    for question, stream in (("Shipping?", False), ("Billing?", True)):
        response = client.post("/v1/chat/completions",
                               json={**CHAT, "messages": [{"role": "user", "content": question}], "stream": stream})
        assert response.status_code == 200 and " ok" in response.get_data(as_text=True)
        response.close()  # as the server closes it once sent: a stream is counted then
    chat = (("endpoint", "/v1/chat/completions"),)
    assert scraped(client) == {("rag_prompt_tokens_total", chat): 80.0,
                               ("rag_request_success_total", chat + (("finished_reason", "stop"),)): 2.0}


def test_a_workers_internal_stream_carries_every_field_of_its_answer_to_the_gateway():
    from pipeline.tool_calls import ToolCallDelta
    from services.roles.worker.role import WorkerRole
    from services.server.answer import PIECES_HEADER, AnswerPiece, FinalAnswer, Usage, from_sse
    from services.server.lifecycle import Readiness
    item = {"token": "ok", "logprob": -0.1, "bytes": [111, 107], "top_logprobs": []}

    class Worker:
        def answer(self, request, deadline, first_piece_only=False):
            yield AnswerPiece("ok", (item,))
            yield AnswerPiece(tool_call=ToolCallDelta(0, "refund", "{}"))
            yield FinalAnswer(request.request_id, "ok", "neutral", "false", finish_reason="tool_calls",
                              usage=Usage(9, 2), logprobs=(item,))

    lifecycle = Lifecycle("node 1", 0.0, exit=lambda code: None)
    role = WorkerRole(Settings.from_env({}), 1, lifecycle)
    role.worker.set(Worker())  # type: ignore[arg-type]
    role.count_query_tokens = len  # type: ignore[method-assign]
    role.bounds = dataclasses.replace(role.bounds, count_tokens=len)
    lifecycle.readiness.set(Readiness.READY)
    response = build_app(role, lifecycle).test_client().post(
        "/internal/answer", json={"request_id": "w-1", "query": "q", "stream": True, "logprobs": 0})
    events = [from_sse(e) for e in sse.iter_events(response.get_data().splitlines(keepends=True))]
    assert events[:2] == [AnswerPiece("ok", (item,)), AnswerPiece(tool_call=ToolCallDelta(0, "refund", "{}"))]
    final = events[2]
    assert isinstance(final, FinalAnswer) and (final.served_by, final.logprobs, final.usage) == (1, (item,), Usage(9, 2))
    # A gateway whose caller collects the reply asks for no pieces past the first: the same answer.
    response = build_app(role, lifecycle).test_client().post(
        "/internal/answer", json={"request_id": "w-2", "query": "q", "stream": True, "logprobs": 0},
        headers={PIECES_HEADER: "none"})
    first, alone = [from_sse(e) for e in sse.iter_events(response.get_data().splitlines(keepends=True))]
    assert first == events[0] and alone == dataclasses.replace(final, request_id="w-2", stages_ms=alone.stages_ms)
