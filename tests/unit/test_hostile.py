"""The hostile soak's judgement: which answers each kind of request may get, slow sockets
against real local servers (one that closes them, one that holds them), and when a worker
leaving the rotation is explained by the node that was killed."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import requests

from profiling.lib.hostile import MALFORMED_FIELD, check_computed, check_refused, malformed_body, slow_socket
from profiling.soak_hostile import ejections, rejoined_after, unexplained


def response(status: int, body: object, headers: dict | None = None) -> requests.Response:
    r = requests.Response()
    r.status_code = status
    r._content = json.dumps(body).encode()
    r.headers.update(headers or {})
    return r


def valid_reply(request_id: str) -> dict:
    return {"request_id": request_id, "generated_response": "ok", "sentiment": "neutral", "is_toxic": "false"}


def test_a_computed_request_may_get_a_valid_reply_or_a_503_that_says_when_to_retry():
    assert check_computed(response(200, valid_reply("a")), "a") == ""
    assert check_computed(response(503, {"error": "full"}, {"Retry-After": "2"}), "a") == ""
    assert "Retry-After" in check_computed(response(503, {"error": "full"}), "a")
    assert "invalid reply" in check_computed(response(200, valid_reply("other-id")), "a")
    for status in (500, 504, 409, 400):
        assert f"HTTP {status}" in check_computed(response(status, {"error": "x"}), "a")


def test_a_refusal_must_have_its_status_and_name_its_field():
    check = check_refused("query")
    assert check(response(400, {"error": "too many tokens", "field": "query"}), "a") == ""
    assert "names field 'body'" in check(response(400, {"error": "bad", "field": "body"}), "a")
    assert "HTTP 500" in check(response(500, {"error": "boom"}), "a")
    assert "HTTP 200" in check(response(200, valid_reply("a")), "a")  # a 200 to a refused request is wrong too
    assert check_refused("query", 409)(response(409, {"error": "conflict", "field": "query"}), "a") == ""


@pytest.mark.parametrize("name", sorted(MALFORMED_FIELD))
def test_malformed_bodies_are_what_they_say(name):
    raw = malformed_body(name, "rid")
    if name == "not_json":
        with pytest.raises(ValueError):
            json.loads(raw)
        return
    body = json.loads(raw)
    field = MALFORMED_FIELD[name]
    assert field not in body or not isinstance(body[field], str)


class Listener:
    """A TCP server on 127.0.0.1 that either closes each connection after `close_after_s` or never does."""

    def __init__(self, close_after_s: float | None):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.close_after_s = close_after_s
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        conn, _ = self.sock.accept()
        self.held.append(conn)
        if self.close_after_s is not None:
            time.sleep(self.close_after_s)  # the server's read timeout, simulated
            conn.close()

    def close(self):
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.mark.parametrize("kind", ["slow_headers", "slow_body"])
def test_a_slow_socket_the_server_closes_in_time_is_allowed(kind):
    server = Listener(close_after_s=0.5)
    try:
        outcome = slow_socket(kind, "127.0.0.1", server.port, read_timeout_s=0.5, t0=time.monotonic(), index=0,
                              margin_s=2.0)
    finally:
        server.close()
    assert outcome.violation == "" and outcome.latency_s < 2.5


def test_a_slow_socket_the_server_holds_open_is_a_violation_and_the_probe_ends_anyway():
    server = Listener(close_after_s=None)
    try:
        started = time.monotonic()
        outcome = slow_socket("slow_headers", "127.0.0.1", server.port, read_timeout_s=0.5, t0=started, index=0,
                              margin_s=1.0)
    finally:
        server.close()
    assert "still open" in outcome.violation
    assert time.monotonic() - started < 5  # bounded by read timeout + margin, not by the server


def test_ejections_are_increments_of_a_workers_failures():
    health = [(0.0, 0, True, 0), (0.0, 1, True, 0), (0.5, 1, True, 0), (1.0, 1, False, 1), (1.5, 1, False, 3),
              (2.0, 1, True, 3), (2.5, 0, True, 0)]
    assert ejections(health) == [(1.0, 1), (1.5, 1)]


def test_rejoin_is_node_1_up_again_after_node_0_saw_it_down_not_the_first_sample_after_the_kill():
    # The faithful soak's failure: node 0 still listed node 1 up 0.1 s after the SIGKILL (it had not
    # noticed yet), which was taken for the rejoin, so the ejection at 0.6 s looked unexplained.
    health = [(170.0, 1, True, 0), (180.1, 1, True, 0), (180.6, 1, False, 1), (190.0, 1, False, 1),
              (181.0, 0, True, 0), (201.5, 1, True, 1), (202.0, 1, True, 1)]
    assert rejoined_after(health, kill_s=180.0) == 201.5 - 180.0
    assert unexplained(ejections(health), kill_s=180.0, rejoin_s=rejoined_after(health, 180.0)) == []
    assert rejoined_after(health[:4], kill_s=180.0) is None  # down and never back
    assert rejoined_after(health[:2], kill_s=180.0) is None  # never seen down: no rejoin either


def test_only_node_1_between_its_kill_and_its_rejoin_is_explained():
    events = [(10.0, 1), (12.0, 1), (5.0, 1), (11.0, 0), (30.0, 1)]
    assert unexplained(events, kill_s=9.5, rejoin_s=5.0) == [(5.0, 1), (11.0, 0), (30.0, 1)]
    assert unexplained(events, kill_s=None, rejoin_s=None) == events  # no kill explains nothing
    assert unexplained([(100.0, 1)], kill_s=9.5, rejoin_s=None) == []  # never back: all after the kill
