"""Hostile input on real node processes (127.0.0.1, tiny stand-ins): queries that are short in
characters but long in tokens, slow (slowloris) clients, and oversized or unauthenticated
bodies on internal endpoints. Each test failed on the code before its fix (see the commits).

The shared cluster, without a CLUSTER_TOKEN (the default deployment), serves the module; node 2
is restarted with a token where a test needs one, and without it again after. Its HEALTH_INTERVAL_S
is long enough that a worker marked down stays down while a test looks; its HTTP_READ_TIMEOUT_S
short (READ_TIMEOUT_S); node 0's HTTP threads (GATEWAY_MAX_IN_FLIGHT + 32) are fewer than the
slow sockets (the old connection limit followed them).
"""
from __future__ import annotations

import contextlib
import json
import re
import socket
import time

import pytest
import requests

from pipeline import spec
from services.server.token import TOKEN_HEADER
from tests.helpers import post_query, uid
from tests.support.shared_cluster import PLAIN

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EMOJI_QUERY = "\U0001F600" * 4096  # MAX_QUERY_CHARS characters, 16384 LLM tokens (the whole KV budget)
READ_TIMEOUT_S = float(PLAIN.env["HTTP_READ_TIMEOUT_S"])
SLOW_SOCKETS = 300


@pytest.fixture
def cluster(shared_cluster):
    # What the tests below rely on. Both workers are in the gateway's rotation at each test's start:
    # the shared cluster starts so and is settled so after every test.
    assert shared_cluster.settings.limits.request_timeout_s > READ_TIMEOUT_S
    assert shared_cluster.settings.gateway.health_interval_s >= 5
    assert shared_cluster.settings.gateway.max_in_flight + 32 < SLOW_SOCKETS
    return shared_cluster


def workers_up(cluster) -> dict[int, bool]:
    body = requests.get(f"{cluster.url(0)}/health", timeout=5).json()
    return {w["node"]: w["up"] for w in body["workers"]}


def metric(cluster, node: int, name: str) -> float:
    text = requests.get(f"{cluster.url(node)}/metrics", timeout=10).text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


@contextlib.contextmanager
def node_2_with_token(cluster, token: str):
    """Node 2 alone asks for a token the workers do not send: each search they make gets 401."""
    def restart(env_token: str | None):
        cluster.kill_node(2)
        if env_token is None:
            cluster.env.pop("CLUSTER_TOKEN", None)
        else:
            cluster.env["CLUSTER_TOKEN"] = env_token
        try:
            cluster.start_node(2)
        finally:
            cluster.env.pop("CLUSTER_TOKEN", None)
        cluster.wait_healthy(nodes=(2,), timeout_s=60)
    restart(token)
    try:
        yield
    finally:
        restart(None)


def raw_exchange(host: str, port: int, head: bytes, timeout_s: float) -> bytes:
    """Send request headers only (no body) and return what the server answers within timeout_s."""
    deadline, received = time.monotonic() + timeout_s, b""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(head)
        while time.monotonic() < deadline:  # an error answer ends with the server closing
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                part = sock.recv(4096)
            except (socket.timeout, ConnectionResetError):
                break
            if not part:
                break
            received += part
    return received


def status_of(raw: bytes) -> int | None:
    match = re.match(rb"HTTP/1\.[01] (\d{3})", raw)
    return int(match.group(1)) if match else None


# ---------------------------------------------------------------- item 1: tokens, not characters

def test_a_query_of_4096_emoji_gets_200_or_a_400_naming_the_token_limit(cluster):
    for i in range(2):  # round robin: one lands on each worker
        r = post_query(cluster, uid(f"emoji{i}"), EMOJI_QUERY)
        assert r.status_code in (200, 400), (r.status_code, r.text[:300])
        if r.status_code == 400:
            body = r.json()
            assert body["field"] == "query" and "token" in body["error"], body
    assert all(workers_up(cluster).values())
    r = post_query(cluster, uid("after-emoji"))
    assert r.status_code == 200, r.text


def test_a_history_near_the_body_limit_in_any_script_is_answered_by_either_worker(cluster):
    """A conversation's history holds most of a request's bytes. Forwarded to node 1, its text must not
    grow past node 1's body limit (JSON's \\u escapes would triple 2- to 4-byte characters), nor
    carry a lone surrogate it could not encode; its oldest turns beyond MAX_HISTORY_TOKENS are dropped."""
    limit = cluster.settings.limits.max_body_bytes
    for script in ("\u00e9", "\u4e2d", "\U0001F600"):  # 2, 3 and 4 bytes of UTF-8 a character
        history: list[dict] = []
        body = {"query": "and to Canada?", "history": history, "request_id": "x" * 40}
        while len(json.dumps(body, ensure_ascii=False).encode()) < limit - 2100:  # turns of 500 characters
            history.append({"role": ("user", "assistant")[len(history) % 2], "content": script * 500})
        assert limit - 2100 <= len(json.dumps(body, ensure_ascii=False).encode()) <= limit
        served = set()
        for i in range(2):  # round robin: one lands on each worker
            r = requests.post(f"{cluster.url(0)}/query", data=json.dumps({**body, "request_id": uid(f"h{i}")},
                                                                          ensure_ascii=False).encode(),
                              headers={"Content-Type": "application/json"}, timeout=180)
            assert r.status_code == 200, (script, r.status_code, r.text[:300])
            assert r.json()["history_turns_dropped"] > 0
            served.add(r.json()["served_by"])
        assert served == {0, 1}
    lone = requests.post(f"{cluster.url(0)}/query", data=b'{"request_id": "lone", "query": "q", "history": '
                         b'[{"role": "user", "content": "\\ud800"}]}', headers={"Content-Type": "application/json"},
                         timeout=60)
    assert lone.status_code == 400 and lone.json()["field"] == "history[0].content"
    assert all(workers_up(cluster).values())


def test_a_request_node_1_fails_with_500_leaves_node_1_in_the_rotation(cluster):
    with node_2_with_token(cluster, "only-node-2-has-it"):
        statuses = [post_query(cluster, uid(f"fail{i}")).status_code for i in range(2)]
        assert statuses == [500, 500], statuses  # one of them failed on node 1
        assert workers_up(cluster) == {0: True, 1: True}
    served = []
    for i in range(4):
        r = post_query(cluster, uid(f"back{i}"), spec.REFERENCE_QUERIES[i])
        assert r.status_code == 200, r.text
        served.append(r.json()["served_by"])
    assert set(served) == {0, 1}, served


# ---------------------------------------------------------------- item 7: slow clients

def test_slowloris_sockets_neither_hang_health_nor_query_and_are_closed(cluster):
    host, port = cluster.settings.node_address(0).host, cluster.settings.node_address(0).port
    sockets = []
    try:
        for _ in range(SLOW_SOCKETS):  # bounded: 300 sockets, 127.0.0.1 only
            sock = socket.create_connection((host, port), timeout=5)
            sock.sendall(b"POST /query HTTP/1.1\r\nHost: x\r\n")  # headers never finish
            sockets.append(sock)
        started = time.monotonic()
        r = requests.get(f"{cluster.url(0)}/health", timeout=3)
        assert r.status_code == 200 and time.monotonic() - started < 2.5
        assert post_query(cluster, uid("slowloris")).status_code == 200
        # Trickling a byte now and then does not keep a request's reading open past the read timeout.
        closed, deadline = set(), time.monotonic() + READ_TIMEOUT_S + 15
        while len(closed) < len(sockets) and time.monotonic() < deadline:
            for i, sock in enumerate(sockets):
                if i not in closed and not _still_open(sock):
                    closed.add(i)
            time.sleep(0.5)  # the trickle's pace, not a wait for an outcome
        assert len(closed) == len(sockets), f"{len(sockets) - len(closed)} trickling sockets still open"
    finally:
        for sock in sockets:
            sock.close()


def _still_open(sock: socket.socket) -> bool:
    """Trickle one header byte (what keeps a slowloris socket active), then look for EOF."""
    try:
        sock.sendall(b"X")
        sock.setblocking(False)
        return sock.recv(1) != b""  # EOF: the server closed it; data would be its error answer
    except BlockingIOError:
        return True  # nothing to read: still open
    except OSError:
        return False  # reset or broken pipe: closed


# ---------------------------------------------------------------- item 8: internal endpoints

def test_node_0_does_not_serve_internal_answer(cluster):
    r = requests.post(f"{cluster.url(0)}/internal/answer", json={"request_id": uid("int"), "query": "Refund?"},
                      timeout=30)
    assert r.status_code == 404, (r.status_code, r.text[:200])


def test_an_oversized_search_body_is_refused_before_it_is_read(cluster):
    addr = cluster.settings.node_address(2)
    head = (f"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {40 * 1024 * 1024}\r\n\r\n").encode()
    started = time.monotonic()
    raw = raw_exchange(addr.host, addr.port, head, timeout_s=5)
    assert status_of(raw) == 413 and time.monotonic() - started < 3, raw[:300]


def test_a_search_body_of_millions_of_numbers_is_refused_quickly_without_a_memory_jump(cluster):
    peak_before = metric(cluster, 2, "rag_process_peak_rss_bytes")
    # 28 MiB, under the byte cap: 7M one-number rows, each a Python list once json.loads has run
    body = b'{"k": 10, "embeddings": [' + b"[0]," * (7 * 1024 * 1024) + b'[0]]}'
    started = time.monotonic()
    r = requests.post(f"{cluster.url(2)}/search", data=body, headers={"Content-Type": "application/json"},
                      timeout=60)
    elapsed = time.monotonic() - started
    assert r.status_code in (400, 413) and r.json()["field"] in ("embeddings", "body"), r.text[:300]
    grown = metric(cluster, 2, "rag_process_peak_rss_bytes") - peak_before
    assert grown < 64 * 1024 * 1024, f"node 2's peak RSS grew by {grown / 2**20:.0f} MiB"
    assert elapsed < 3, elapsed


def test_without_the_token_a_request_is_refused_before_its_body_is_read(cluster):
    addr = cluster.settings.node_address(2)
    head = (f"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {30 * 1024 * 1024}\r\n\r\n").encode()
    with node_2_with_token(cluster, "node-2-token"):
        started = time.monotonic()
        raw = raw_exchange(addr.host, addr.port, head, timeout_s=5)
        assert status_of(raw) == 401 and time.monotonic() - started < 3, raw[:300]
        assert TOKEN_HEADER.encode() in raw.split(b"\r\n\r\n", 1)[1]  # the JSON body names the header
