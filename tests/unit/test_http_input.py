"""Input rules, the cluster token and node-to-node client behaviour, without models or a cluster."""
from __future__ import annotations

import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from flask import jsonify

from pipeline.config import Settings
from services.cluster.clients import IndexClient, WorkerClient
from services.roles.index.search import max_search_values, parse_search_body
from services.server import sse
from services.server.answer import PIECES_HEADER
from services.server.answer_request import AnswerRequest
from services.server.app import make_app
from services.server.body import read_json_object, require_string
from services.server.errors import (
    ApiError,
    NodeUnreachable,
    PeerFailed,
    PeerRejected,
    PeerRejectedToken,
    PeerTimedOut,
    PeerUnavailable,
    ShardUnavailable,
)
from services.server.http_server import HeaderGate, header_gate
from services.server.stream_response import collect
from services.server.token import TOKEN_HEADER, internal_endpoint

pytestmark = pytest.mark.timeout(60)
TOKEN = "s3cret-Token"


@pytest.fixture(scope="module")
def client():
    app = make_app("test")

    @app.post("/echo")
    def echo():
        body = read_json_object(1024)
        return jsonify({"id": require_string(body, "request_id", 8), "query": require_string(body, "query", 32)})

    @app.post("/internal")
    @internal_endpoint(TOKEN)
    def internal():
        return jsonify({"ok": True})

    return app.test_client()


@pytest.mark.parametrize("data,content_type,status,field", [
    (b'{"request_id": "a", "query": "b", "extra": [1, {"x": NaN}]}', "application/json", 200, None),
    (b'{"request_id": "a", "query": "b"}', "text/plain", 415, "Content-Type"),
    (b'{"request_id": "a", "query": "b"}', None, 415, "Content-Type"),
    (b"{oops", "application/json", 400, "body"),
    (b"[" * 5000 + b"]" * 5000, "application/json", 413, "body"),
    (b"[" * 500 + b"]" * 500, "application/json", 400, "body"),  # deep, not a JSON object
    (b'"just a string"', "application/json", 400, "body"),
    (b'{"request_id": "123456789", "query": "b"}', "application/json", 400, "request_id"),
    (b'{"request_id": "a", "query": "' + b"q" * 33 + b'"}', "application/json", 400, "query"),
    (b'{"request_id": "a", "query": "  "}', "application/json", 400, "query"),
    (b'{"request_id": "a", "query": null}', "application/json", 400, "query"),
    (b'{"request_id": 7, "query": "b"}', "application/json", 400, "request_id"),
    (b'{"request_id": "a", "query": "\\ud800"}', "application/json", 400, "query"),
    (b'\xff\xfe\x00', "application/json", 400, "body"),
])
def test_body_rules(client, data, content_type, status, field):
    headers = {"Content-Type": content_type} if content_type else {}
    response = client.post("/echo", data=data, headers=headers)
    assert response.status_code == status, response.get_json()
    assert response.is_json
    if status != 200:
        assert response.get_json()["error"] and response.get_json()["field"] == field


def test_deep_nesting_within_the_size_limit_is_a_400_not_a_500():
    app = make_app("deep")

    @app.post("/echo")
    def echo():
        return jsonify(read_json_object(1_000_000))

    response = app.test_client().post("/echo", data=b"[" * 200_000, content_type="application/json")
    assert response.status_code == 400 and "nested" in response.get_json()["error"]


def test_chunked_body_over_the_limit_is_413(client):
    # No Content-Length (as with chunked uploads, which waitress marks wsgi.input_terminated):
    # the limit must hold while reading.
    response = client.post("/echo", input_stream=io.BytesIO(b" " * 2000), content_type="application/json",
                           environ_overrides={"wsgi.input_terminated": True, "CONTENT_LENGTH": ""})
    assert response.status_code == 413 and "over the limit" in response.get_json()["error"]


@pytest.mark.parametrize("headers,status", [
    ({}, 401),
    ({TOKEN_HEADER: "wrong"}, 401),
    ({TOKEN_HEADER: TOKEN + "x"}, 401),
    ({TOKEN_HEADER: "ünïcode"}, 401),
    ({TOKEN_HEADER: TOKEN}, 200),
])
def test_internal_endpoint_requires_the_token(client, headers, status):
    response = client.post("/internal", json={}, headers=headers)
    assert response.status_code == status
    if status == 401:
        assert response.get_json()["field"] == TOKEN_HEADER


def test_no_token_configured_means_no_check():
    app = make_app("open")

    @app.post("/internal")
    @internal_endpoint("")
    def internal():
        return jsonify({"ok": True})

    assert app.test_client().post("/internal", json={}).status_code == 200


@pytest.mark.parametrize("body,field", [
    ({"embeddings": [[10 ** 400] * 4], "k": 2}, "embeddings"),
    ({"embeddings": [[1e300] * 4], "k": 2}, "embeddings"),
    ({"embeddings": [[True] * 4], "k": 2}, "embeddings"),
    ({"embeddings": [[0.1] * 4], "k": True}, "k"),
    ({"embeddings": "vectors", "k": 2}, "embeddings"),
])
def test_search_body_rules(body, field):
    from services.server.errors import ApiError
    with pytest.raises(ApiError) as err:
        parse_search_body(body, dim=4, max_queue=256)
    assert err.value.status == 400 and err.value.field == field


def test_search_takes_one_limit_on_vectors_the_smaller_of_the_body_rule_and_the_queue_naming_its_source():
    from services.roles.index.search import MAX_SEARCH_VECTORS
    from services.server.errors import ApiError
    queue = Settings.from_env({}).batching("index").max_queue  # what node 2's batching queue holds (256)
    assert queue < MAX_SEARCH_VECTORS
    vectors, _ = parse_search_body({"embeddings": [[0.5] * 4] * queue, "k": 2}, dim=4, max_queue=queue)
    assert vectors.shape == (queue, 4)
    with pytest.raises(ApiError) as err:
        parse_search_body({"embeddings": [[0.5] * 4] * 300, "k": 2}, dim=4, max_queue=queue)
    assert err.value.status == 400 and err.value.field == "embeddings"
    assert err.value.message == (f"'embeddings' holds 300 vectors; at most {queue} are accepted "
                                 f"(STAGE_MAX_QUEUE: the index's batching queue holds {queue})")
    with pytest.raises(ApiError) as err:  # a queue above the body rule: the body rule is the limit
        parse_search_body({"embeddings": [[0.5] * 4] * (MAX_SEARCH_VECTORS + 1)}, dim=4, max_queue=4096)
    assert err.value.message == (f"'embeddings' holds {MAX_SEARCH_VECTORS + 1} vectors; at most "
                                 f"{MAX_SEARCH_VECTORS} are accepted (MAX_SEARCH_VECTORS, the /search body's rule)")


def test_settings_keep_the_token_out_of_repr_and_errors():
    settings = Settings.from_env({"CLUSTER_TOKEN": TOKEN})
    assert settings.cluster.cluster_token == TOKEN and TOKEN not in repr(settings)
    with pytest.raises(Exception) as err:
        Settings.from_env({"CLUSTER_TOKEN": "has space"})
    assert "has space" not in str(err.value)


# ---------------------------------------------------------------- the node-to-node clients

class Recorder(BaseHTTPRequestHandler):
    """A tiny HTTP node: answers per `plan` (a list of statuses, then 200) and records what it got."""
    plan: list[int] = []
    seen: list[tuple[dict, dict]] = []
    pieces: list[bytes] = []  # token events an /internal/answer stream sends before its reply

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((dict(self.headers), body))
        status = type(self).plan.pop(0) if type(self).plan else 200
        reply = ({"ids": [[1, 2]], "distances": [[0.0, 0.1]]} if self.path == "/search"
                 else {"request_id": body.get("request_id"), "generated_response": "Hello", "sentiment": "neutral",
                       "is_toxic": False}) if status == 200 else {"error": "nope"}
        streamed = status == 200 and self.path == "/internal/answer"  # a worker's answer: always a stream
        data = b"".join(type(self).pieces) + sse.reply_event(reply) if streamed else json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", sse.MEDIA_TYPE if streamed else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def node():
    Recorder.plan, Recorder.seen, Recorder.pieces = [], [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_worker_client_sends_token_and_the_time_left(node):
    client = WorkerClient(node, connect_timeout_s=1, token=TOKEN)
    reply = collect(client.answer(AnswerRequest("r1", "q"), 12.5))
    assert (reply.request_id, reply.generated_response) == ("r1", "Hello")
    headers, body = Recorder.seen[0]
    assert headers[TOKEN_HEADER] == TOKEN
    assert body == {"request_id": "r1", "query": "q", "stream": True, "timeout_s": 12.5}  # always the stream
    assert headers[PIECES_HEADER] == "none"  # its caller collects the reply: no pieces past the first
    collect(client.answer(AnswerRequest("r2", "q", stream=True), 12.5))
    headers, body = Recorder.seen[1]
    assert body["stream"] is True and headers.get(PIECES_HEADER) is None  # its caller reads the pieces


def test_worker_client_relays_each_piece_whole_its_log_probabilities_and_call_deltas_included(node):
    from pipeline.tool_calls import ToolCallDelta
    from services.server.answer import AnswerPiece, FinalAnswer, sse_event
    pieces = [AnswerPiece("Hel", logprobs=({"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108],
                                              "top_logprobs": []},)),
              AnswerPiece("", tool_call=ToolCallDelta(0, "lookup", '{"order": ')),
              AnswerPiece("", tool_call=ToolCallDelta(0, None, '"ABC123"}'))]
    Recorder.pieces = [sse_event(piece) for piece in pieces]
    events = list(WorkerClient(node, connect_timeout_s=1).answer(AnswerRequest("r1", "q"), 5))
    assert events[:-1] == pieces
    assert isinstance(events[-1], FinalAnswer) and events[-1].request_id == "r1"


@pytest.mark.parametrize("status,error", [(503, PeerUnavailable), (401, PeerRejectedToken), (504, PeerTimedOut),
                                          (500, PeerFailed), (502, PeerFailed), (400, PeerRejected)])
def test_worker_client_says_what_happened_by_the_errors_type(node, status, error):
    Recorder.plan = [status]
    with pytest.raises(error) as err:
        WorkerClient(node, connect_timeout_s=1).answer(AnswerRequest("r1", "q"), 5)
    assert type(err.value) is error and err.value.message == "nope"  # the peer's own words
    if error is not PeerTimedOut:
        assert str(err.value) == f"HTTP {status}: nope"  # the status, for the log
    with pytest.raises(NodeUnreachable):
        WorkerClient("http://127.0.0.1:9", connect_timeout_s=0.2).answer(AnswerRequest("r1", "q"), 5)


def test_node_to_node_calls_go_direct_whatever_proxy_the_environment_names(node, monkeypatch):
    """A lab machine's HTTP_PROXY (for pip, say) is not for the cluster's own calls: they reach the node directly."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    client = IndexClient(node, connect_timeout_s=1, read_timeout_s=5, token=TOKEN, max_attempts=1)
    ids, _ = client.search(np.zeros((1, 4)), 2)
    assert ids == [[1, 2]] and len(Recorder.seen) == 1


def test_index_client_retries_5xx_past_max_attempts_while_the_deadline_allows(node):
    Recorder.plan = [503, 500, 504, 502, 503, 500]  # every 5xx: unavailable, failed, timed out
    client = IndexClient(node, connect_timeout_s=1, read_timeout_s=5, token=TOKEN, max_attempts=2,
                         backoff_s=0.01, max_backoff_s=0.02)
    ids, _ = client.search(np.zeros((1, 4)), 2, deadline=time.monotonic() + 10)
    assert ids == [[1, 2]] and len(Recorder.seen) == 7
    assert all(h[TOKEN_HEADER] == TOKEN for h, _ in Recorder.seen)


def test_index_client_gives_up_at_the_deadline_calling_a_failing_index_unavailable(node):
    Recorder.plan = [500] * 1000
    client = IndexClient(node, connect_timeout_s=1, read_timeout_s=5, backoff_s=0.05, max_backoff_s=0.1)
    started = time.monotonic()
    with pytest.raises(ShardUnavailable, match="index server is unavailable"):
        client.search(np.zeros((1, 4)), 2, deadline=started + 0.6)
    assert 0.4 < time.monotonic() - started < 1.0


def test_index_client_does_not_retry_4xx(node):
    Recorder.plan = [400]
    client = IndexClient(node, connect_timeout_s=1, read_timeout_s=5, backoff_s=0.01)
    with pytest.raises(PeerRejected) as err:
        client.search(np.zeros((1, 4)), 2, deadline=time.monotonic() + 5)
    assert str(err.value).startswith("HTTP 400") and len(Recorder.seen) == 1
    Recorder.plan, Recorder.seen = [401], []  # a refused token is a 4xx too
    with pytest.raises(PeerRejectedToken):
        client.search(np.zeros((1, 4)), 2, deadline=time.monotonic() + 5)
    assert len(Recorder.seen) == 1


def test_index_client_without_deadline_stops_after_max_attempts():
    client = IndexClient("http://127.0.0.1:9", connect_timeout_s=0.2, read_timeout_s=0.2, max_attempts=3,
                         backoff_s=0.01)
    with pytest.raises(NodeUnreachable):
        client.search(np.zeros((1, 4)), 2)


def test_reliability_settings_defaults_and_consistency():
    s = Settings.from_env({})
    assert (s.limits.max_request_id_chars, s.limits.max_query_chars, s.limits.max_body_bytes) == (256, 4096, 65536)
    assert (s.gateway.idempotency_cache_size, s.gateway.idempotency_ttl_s, s.gateway.max_in_flight) == (1024, 300.0, 96)
    assert (s.limits.shutdown_grace_s, s.cluster.cluster_token) == (60.0, "")
    with pytest.raises(Exception, match=r"^SEARCH_MAX_BATCH='8' is not valid: expected at most STAGE_MAX_QUEUE \(4\)"):
        Settings.from_env({"STAGE_MAX_QUEUE": "4", "SEARCH_MAX_BATCH": "8"})


# ---------------------------------------------------------------- checks before the body is read

def test_the_header_gate_refuses_without_the_token_then_by_declared_size():
    gate = HeaderGate(TOKEN, frozenset({"/search"}), 100)
    for path in ("/search", "/internal/answer", "/internal/anything"):
        refused = gate.refusal(path, "wrong", 10**9)
        assert refused.status == 401 and refused.field == TOKEN_HEADER  # the token first, whatever the size
        assert gate.refusal(path, TOKEN, 100) is None
    assert gate.refusal("/query", "", 100) is None  # public: no token asked
    refused = gate.refusal("/query", "", 101)
    assert refused.status == 413 and refused.field == "body" and "100" in refused.message
    assert HeaderGate("", frozenset({"/search"}), 100).refusal("/search", "", 50) is None  # no token configured


def test_the_header_gate_finds_the_internal_endpoints_of_an_app():
    app = make_app("gate")

    @app.post("/search")
    @internal_endpoint(TOKEN)
    def search():
        return jsonify({})

    @app.post("/query")
    def query():
        return jsonify({})

    assert header_gate(app, TOKEN, 100).internal_paths == {"/search"}


def test_a_body_of_too_many_json_values_is_refused_before_parsing():
    app = make_app("values")
    limit = max_search_values(4)
    with app.test_request_context("/", method="POST", content_type="application/json",
                                  data=b'{"embeddings": [' + b"[0]," * limit + b"[0]]}"):
        with pytest.raises(ApiError) as refused:
            read_json_object(10**8, max_values=limit)
    assert refused.value.status == 400 and refused.value.field == "body" and str(limit) in refused.value.message
    valid = json.dumps({"k": 10, "embeddings": [[0.5] * 4] * 1024}).encode()
    with app.test_request_context("/", method="POST", content_type="application/json", data=valid):
        assert len(read_json_object(10**8, max_values=limit)["embeddings"]) == 1024  # the largest valid body


def test_http_limits_are_derived_from_the_request_timeout_and_threads():
    s = Settings.from_env({"REQUEST_TIMEOUT_S": "300"})
    assert s.read_timeout_s == 10 and s.connection_limit(128) == 1024 and s.connection_limit(1000) == 4000
    assert Settings.from_env({"REQUEST_TIMEOUT_S": "30"}).read_timeout_s == 2
    assert Settings.from_env({"HTTP_READ_TIMEOUT_S": "4", "HTTP_CONNECTION_LIMIT": "50"}).connection_limit(128) == 50


def test_http_and_query_token_limits_are_checked_at_startup():
    from pipeline.config import ConfigError
    with pytest.raises(ConfigError, match=r"^HTTP_READ_TIMEOUT_S='30' is not valid: expected less than REQUEST_TIMEOUT_S"):
        Settings.from_env({"REQUEST_TIMEOUT_S": "30", "HTTP_READ_TIMEOUT_S": "30"})
    # (4096 + MAX_HISTORY_TOKENS 1024 + 512 + OPENAI_MAX_TOKENS_CAP 512) * 4 > 16384
    with pytest.raises(ConfigError, match=r"^MAX_QUERY_TOKENS='4096' is not valid: expected at most 2048"):
        Settings.from_env({"MAX_QUERY_TOKENS": "4096"})
    with pytest.raises(ConfigError, match=r"^MAX_QUERY_TOKENS='4096' is not valid: expected at most 3072"):
        Settings.from_env({"MAX_QUERY_TOKENS": "4096", "MAX_HISTORY_TOKENS": "0"})
    with pytest.raises(ConfigError, match=r"^MAX_QUERY_TOKENS='3072' is not valid: expected at most 1024"):
        Settings.from_env({"MAX_QUERY_TOKENS": "3072", "OPENAI_MAX_TOKENS_CAP": "2560", "MAX_HISTORY_TOKENS": "0"})
    with pytest.raises(ConfigError, match=r"^MAX_QUERY_TOKENS='1024' is not valid: expected at most 512"):
        Settings.from_env({"MAX_HISTORY_TOKENS": "2560"})
    Settings.from_env({"MAX_QUERY_TOKENS": "4096", "GENERATE_KV_CACHE_TOKENS": "24576"})  # (4096 + 1024 + 512 + 512) * 4
