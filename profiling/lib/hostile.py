"""What an adversarial client sends node 0, and which answers a correct service may give.

Each probe sends one kind of request and returns an Outcome whose `violation` is "" when
the answer is one the README promises for that kind, else why not. The hostile soak
(profiling/soak_hostile.py) mixes them with normal load; nothing here decides when.

Allowed answers, per kind:
- normal, near_limit: 200 with a reply that honours the contract, or 503 with Retry-After
  (capacity or no worker: nothing was computed, the client may retry);
- oversized (short in characters, over MAX_QUERY_TOKENS in tokens): 400 naming `query`;
- malformed (not JSON, a field missing or of the wrong type): 400 naming the field;
- duplicate (callers sharing one request_id and query at once): the same 200 reply for each,
  or 503 with Retry-After beyond the joiner caps;
- conflict (that id again with another query): 409 naming `query`;
- slow_headers / slow_body (a slowloris socket): the node closes it (or answers 4xx)
  within its read timeout plus a margin, never holding it open.
"""
from __future__ import annotations

import json
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import requests

from pipeline import spec
from profiling.lib.load import json_or_none

EMOJI = "\U0001F600"  # one character, several LLM tokens: the shape of item 1's hostile query
# A slow socket sends one byte per this many seconds: slower than any real client.
TRICKLE_EVERY_S = 1.0
# Past the node's read timeout, how long a slow socket may stay open before it counts as held.
SLOW_CLOSE_MARGIN_S = 5.0


@dataclass
class Outcome:
    """One request (or one slow socket) and what came of it; a row of the requests CSV."""
    kind: str
    request_id: str
    sent_s: float  # since the start of the run
    latency_s: float = float("nan")
    status: int = 0  # HTTP status; 0: none (a slow socket closed, or no answer at all)
    violation: str = ""  # "" when the answer is allowed for this kind
    served_by: str = ""


def _error_field(response: requests.Response) -> str | None:
    body = json_or_none(response, {})
    return body.get("field") if isinstance(body.get("error"), str) else None


def check_computed(response: requests.Response, request_id: str) -> str:
    """normal and near_limit: a valid 200 reply, or 503 with Retry-After."""
    if response.status_code == 200:
        problems = spec.validate_reply(json_or_none(response, None), request_id)
        return f"invalid reply: {problems}" if problems else ""
    if response.status_code == 503:
        return "" if response.headers.get("Retry-After") else "503 without Retry-After"
    return f"HTTP {response.status_code} is not allowed: {response.text[:200]}"


def check_refused(field: str, status: int = 400) -> Callable[[requests.Response, str], str]:
    """A 4xx (400 by default) whose JSON error names `field`."""
    def check(response: requests.Response, _request_id: str) -> str:
        if response.status_code != status:
            return f"HTTP {response.status_code}, expected {status} naming {field!r}: {response.text[:200]}"
        named = _error_field(response)
        return "" if named == field else f"{status} names field {named!r}, expected {field!r}"
    return check


# Bodies a confused or hostile client sends, and the field each 400 must name.
MALFORMED_FIELD = {"not_json": "body", "no_query": "query", "query_not_string": "query",
                   "id_not_string": "request_id"}


def malformed_body(name: str, request_id: str) -> bytes:
    bodies = {"not_json": b"{this is not json",
              "no_query": {"request_id": request_id},
              "query_not_string": {"request_id": request_id, "query": ["a", 1]},
              "id_not_string": {"request_id": {"x": 1}, "query": "Where is my order?"}}
    body = bodies[name]
    return body if isinstance(body, bytes) else json.dumps(body).encode()


class Prober:
    """Sends probes to one gateway; every call returns Outcomes, never raises for the service's sake."""

    def __init__(self, url: str, timeout_s: float, t0: float):
        self.url, self.timeout_s, self.t0 = url, timeout_s, t0

    def post(self, kind: str, request_id: str, check: Callable[[requests.Response, str], str], *,
             json_body: dict | None = None, data: bytes | None = None,
             session: requests.Session | None = None) -> Outcome:
        outcome = Outcome(kind, request_id, time.monotonic() - self.t0)
        started = time.monotonic()
        post = session.post if session is not None else requests.post
        try:
            response = post(f"{self.url}/query", json=json_body, data=data, timeout=self.timeout_s,
                            headers={"Content-Type": "application/json"})
        except requests.RequestException as exc:  # no answer at all: the one thing never allowed
            outcome.violation = f"no answer: {type(exc).__name__}"
        else:
            outcome.status = response.status_code
            outcome.violation = check(response, request_id)
            if response.status_code == 200:
                outcome.served_by = str(json_or_none(response, {}).get("served_by", ""))
        outcome.latency_s = time.monotonic() - started
        return outcome

    def query(self, kind: str, request_id: str, query: str, check=check_computed, session=None) -> Outcome:
        return self.post(kind, request_id, check, json_body={"request_id": request_id, "query": query},
                         session=session)

    def malformed(self, name: str, request_id: str) -> Outcome:
        return self.post("malformed", request_id, check_refused(MALFORMED_FIELD[name]),
                         data=malformed_body(name, request_id))

    def duplicates(self, request_id: str, query: str, callers: int) -> list[Outcome]:
        """`callers` at once with one id and query: each gets the same reply, or a 503 past the caps."""
        with ThreadPoolExecutor(callers, thread_name_prefix="dup") as pool:
            futures = [pool.submit(self._duplicate, request_id, query) for _ in range(callers)]
            results = [f.result() for f in futures]
        outcomes = [o for o, _ in results]
        answers = {a for _, a in results if a is not None}
        if len(answers) > 1:  # one id, two different answers: the idempotency promise broken
            for outcome in outcomes:
                outcome.violation = outcome.violation or f"{len(answers)} different answers for one request_id"
        return outcomes

    def _duplicate(self, request_id: str, query: str) -> tuple[Outcome, str | None]:
        answer: list[str] = []

        def check(response: requests.Response, rid: str) -> str:
            if response.status_code == 200:
                answer.append(json.dumps(json_or_none(response, {}), sort_keys=True))
            return check_computed(response, rid)
        return self.query("duplicate", request_id, query, check), (answer[0] if answer else None)

    def conflict(self, request_id: str, other_query: str) -> Outcome:
        return self.query("conflict", request_id, other_query, check_refused("query", 409))


# ------------------------------------------------------------------------- slow sockets

def slow_socket(kind: str, host: str, port: int, read_timeout_s: float, t0: float, index: int,
                margin_s: float = SLOW_CLOSE_MARGIN_S) -> Outcome:
    """A slowloris client: headers (slow_headers) or a body (slow_body) one byte a second.

    Allowed: the node closes the connection (or answers 4xx) within its read timeout plus
    margin_s. Bounded by that same time: a socket still open then is a violation.
    """
    outcome = Outcome(kind, f"{kind}-{index}", time.monotonic() - t0)
    limit_s = read_timeout_s + margin_s
    started = time.monotonic()
    head = b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n"
    first, trickle = (head[:10], head[10:]) if kind == "slow_headers" else (head + b"\r\n", b"{" + b" " * 4095)
    try:
        with socket.create_connection((host, port), timeout=limit_s) as sock:
            sock.sendall(first)
            outcome.status, closed = _trickle(sock, trickle, started + limit_s)
    except OSError as exc:  # refused or reset on connect: also not holding anything
        outcome.status, closed = 0, True
        outcome.served_by = type(exc).__name__
    outcome.latency_s = time.monotonic() - started
    if not closed:
        outcome.violation = f"still open {limit_s:g} s after it started (read timeout {read_timeout_s:g} s)"
    elif outcome.status and not 400 <= outcome.status < 500:
        outcome.violation = f"HTTP {outcome.status}, expected the connection closed or a 4xx"
    return outcome


def _trickle(sock: socket.socket, data: bytes, until: float) -> tuple[int, bool]:
    """Send data a byte at a time until the peer closes (status it sent, True) or `until` (0, False)."""
    for byte in data:
        if time.monotonic() >= until:
            return 0, False
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return 0, True
        sock.settimeout(max(0.01, min(TRICKLE_EVERY_S, until - time.monotonic())))
        try:
            answer = sock.recv(4096)
        except socket.timeout:
            continue
        except OSError:
            return 0, True
        match = re.match(rb"HTTP/1\.[01] (\d{3})", answer)
        return (int(match.group(1)) if match else 0), True  # b"": closed without a word
    return 0, False
