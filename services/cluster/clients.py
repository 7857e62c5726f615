"""Node-to-node calls: JSON over pooled `requests` sessions, each with a connect and a read timeout,
the cluster token and (tracing on) a CLIENT span. Idempotent searches are retried with capped,
jittered backoff until the caller's deadline. The one module that reads another node's status
codes: each becomes a typed error (services.server.errors); callers catch types only.
"""
from __future__ import annotations

import itertools
import json
import logging
import random
import time
from collections.abc import Callable, Sequence

import numpy as np
import requests
from requests.adapters import HTTPAdapter

from services.cluster.abortable import AbortableCalls
from services.server import sse, tracing
from services.server.answer import PIECES_HEADER, FinalAnswer, from_sse
from services.server.answer_request import AnswerRequest
from services.server.errors import (
    SHARD_UNAVAILABLE_REASON,
    DeadlineExceeded,
    NodeUnreachable,
    PeerError,
    PeerFailed,
    PeerRejected,
    PeerRejectedToken,
    PeerShardUnavailable,
    PeerTimedOut,
    PeerUnavailable,
    ShardUnavailable,
)
from services.server.request_ids import REQUEST_ID_HEADER, batch_request_ids, current_request_id
from services.server.stream_response import AnswerStream
from services.server.token import TOKEN_HEADER

log = logging.getLogger(__name__)

# A read this close to the deadline cannot bring an answer back in time.
MIN_ATTEMPT_S = 0.05
# Node 1 answers 504 at the deadline we send it: wait a little longer, to see that 504.
WORKER_REPLY_GRACE_S = 2.0


def pooled_session(pool_size: int, token: str = "") -> requests.Session:
    """A session for the cluster's own calls: pooled connections, the cluster token, and nothing from the
    environment (no HTTP_PROXY, no .netrc): a lab machine's proxy is not for node-to-node calls, and reading
    the environment took a tenth of a worker's search thread under load (docs/performance.md, section 34)."""
    session = requests.Session()
    session.trust_env = False
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    if token:
        session.headers[TOKEN_HEADER] = token
    return session


def peer_error(response: requests.Response) -> PeerError | PeerTimedOut:
    """The typed error for another node's error status, with its own message (and its machine-readable
    reason, if any)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return status_error(response.status_code, response.text[:200])
    reason = body.get("reason")
    return status_error(response.status_code, str(body.get("error", response.text[:200])),
                        reason if isinstance(reason, str) else None)


def status_error(status: int, message: str, reason: str | None = None) -> PeerError | PeerTimedOut:
    """The typed error for an error status another node answered (or ended its stream with)."""
    if status == 401:
        return PeerRejectedToken(message)
    if status == 503 and reason == SHARD_UNAVAILABLE_REASON:
        return PeerShardUnavailable(message)
    if status == 503:
        return PeerUnavailable(message)
    if status == 504:
        return PeerTimedOut(message)
    return PeerRejected(status, message) if status < 500 else PeerFailed(status, message)


def post(session: requests.Session, url: str, who: str, call: tracing.ClientCall, timed_out: str,
         **kwargs) -> requests.Response:
    """One POST to another node (`who`), answered 200; else its typed error: NodeUnreachable (down:
    any work started died with it), PeerTimedOut (`who timed_out`: the work may be in flight there)
    or the error status's."""
    try:
        response = session.post(url, **kwargs)
    except requests.ConnectionError as exc:
        raise NodeUnreachable(f"{who} unreachable: {exc.__class__.__name__}") from None
    except requests.Timeout:
        raise PeerTimedOut(f"{who} {timed_out}") from None
    call.answered(response.status_code)
    if response.status_code != 200:
        try:
            raise peer_error(response)
        finally:
            response.close()
    return response


# What a search may retry: the index node down, restarting, slow or failing (any 5xx), never a 4xx.
RETRIED = (NodeUnreachable, PeerUnavailable, PeerTimedOut, PeerFailed)
# Of those, what says the shard is not there (rather than slow): given up on, a ShardUnavailable.
DOWN = (NodeUnreachable, PeerUnavailable, PeerFailed)


class IndexClient:
    """One index shard's /search on its replicas: each search starts at the next one in turn and
    moves on at a failure worth retrying, backing off after a round. With a deadline, retries run
    until it (max_attempts bounds calls without one). Given up on: ShardUnavailable while the shard
    is down (unreachable, 503, 5xx, no replica known), DeadlineExceeded while it is only slow.

    `allow_none`: the replicas come from a membership (set_replicas), so none may be known for a while."""

    def __init__(self, base_urls: str | Sequence[str], *, connect_timeout_s: float, read_timeout_s: float,
                 token: str = "", name: str = "index server", pool_size: int = 16, max_attempts: int = 5,
                 backoff_s: float = 0.2, max_backoff_s: float = 2.0, allow_none: bool = False):
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls and not allow_none:
            raise ValueError("an index shard needs at least one replica")
        self.name = name
        self.set_replicas(urls)
        self._turn = itertools.count()
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.session = pooled_session(pool_size, token)
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s  # so a node that comes back is noticed within about this

    def set_replicas(self, base_urls: Sequence[str]) -> None:
        """The replicas from now on (a search in progress keeps the list it started with)."""
        self.base_urls = [url.rstrip("/") for url in base_urls]

    def _timeouts(self, deadline: float | None) -> tuple[float, float]:
        if deadline is None:
            return self.connect_timeout_s, self.read_timeout_s
        left = max(MIN_ATTEMPT_S, deadline - time.monotonic())
        return min(self.connect_timeout_s, left), min(self.read_timeout_s, left)

    def _attempt(self, base_url: str, payload: dict, deadline: float | None, headers: dict,
                 parents: Sequence = (), attempt: int = 1) -> tuple[list, list]:
        """One POST; an error in RETRIED may be retried, anything else may not."""
        url = f"{base_url}/search"
        with tracing.client_span("POST /search", url, parents, attributes={"rag.attempt": attempt,
                                 "rag.batch_size": len(payload["embeddings"])}) as call:
            response = post(self.session, url, f"{self.name} at {base_url}", call, "timed out", json=payload,
                            timeout=self._timeouts(deadline), headers={**headers, **call.headers})
            body = response.json()
            if payload.get("version") is not None and body.get("version") != payload["version"]:
                raise PeerFailed(502, f"{self.name} at {base_url} answered data version {body.get('version')!r} "
                                      f"for a search of {payload['version']!r}")
            return body["ids"], body["distances"]

    def search(self, vectors: np.ndarray | Sequence[Sequence[float]], k: int,
               deadline: float | None = None, request_ids: Sequence[str] = (),
               trace_parents: Sequence = (), version: str | None = None,
               lists: Sequence[Sequence[int]] | None = None) -> tuple[list[list[int]], list[list[float]]]:
        """`request_ids` go in one X-Request-ID header, so node 2's log line names them;
        `trace_parents`: their span contexts (each attempt joins the first's trace, links the others);
        `version`: the data version to search (None: the node's current one); `lists`: each vector's IVF
        lists to probe, for a centroid shard."""
        payload: dict = {"embeddings": np.asarray(vectors, dtype=np.float32).tolist(), "k": k}
        if lists is not None:
            payload["lists"] = [list(row) for row in lists]
        if version is not None:
            payload["version"] = version
        headers = {REQUEST_ID_HEADER: batch_request_ids(list(request_ids))} if request_ids else {}
        first = next(self._turn)
        attempt, rounds = 0, 0
        error: Exception | None = None
        while True:
            if deadline is not None and deadline - time.monotonic() < MIN_ATTEMPT_S:
                raise self._given_up(attempt, error)
            base_urls = self.base_urls  # read once: the membership may replace the list meanwhile
            replicas = len(base_urls)
            attempt += 1
            if not base_urls:  # none known now (a DNS name listing nobody): a round with nobody to ask
                error = NodeUnreachable(f"{self.name}: no replica known")
            else:
                try:
                    return self._attempt(base_urls[(first + attempt - 1) % replicas], payload, deadline, headers,
                                         trace_parents, attempt)
                except RETRIED as exc:  # anything else (a 4xx: our request was wrong) goes up at once
                    error = exc
            if replicas and attempt % replicas:  # another replica has not been tried this round: at once
                log.warning("search attempt %d failed (%s); trying another replica", attempt, error)
                continue
            rounds += 1
            pause = min(self.max_backoff_s, self.backoff_s * 2 ** (rounds - 1)) * random.uniform(0.5, 1.5)
            if deadline is None and attempt >= self.max_attempts:
                raise error
            if deadline is not None and time.monotonic() + pause + MIN_ATTEMPT_S > deadline:
                raise self._given_up(attempt, error)
            log.warning("search attempt %d failed (%s); retrying in %.2fs", attempt, error, pause)
            time.sleep(pause)

    def _given_up(self, attempts: int, last: Exception | None) -> Exception:
        """At the deadline: ShardUnavailable if the shard was down at the last try, else DeadlineExceeded."""
        if isinstance(last, DOWN):
            error: Exception = ShardUnavailable(f"{self.name} is unavailable: no replica answered in {attempts} "
                                                f"attempts before the request's deadline (last: {last})")
        else:
            detail = f" (last: {last})" if last is not None else ""
            error = DeadlineExceeded(f"search gave up at the request deadline after {attempts} attempts{detail}")
        error.__cause__ = last
        return error

    def close(self) -> None:
        self.session.close()


class WorkerClient:
    """The gateway's handle on a remote worker's internal answer endpoint: one call, `answer`, a stream."""

    def __init__(self, base_url: str, *, connect_timeout_s: float, token: str = "", pool_size: int = 64):
        self.base_url = base_url.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.session = pooled_session(pool_size, token)
        self._calls = AbortableCalls(f"to-{self.base_url}", pool_size)

    def answer(self, request: AnswerRequest, timeout_s: float) -> AnswerStream:
        """The worker's answer stream relayed as each event arrives: text pieces, then the reply. An
        error status raises here; an error event raises its typed error where it comes."""
        response = self._calls.call(self._post, request, timeout_s)
        self._calls.hold(response)
        return self._relay(response)

    def abort(self, make_error: Callable[[], BaseException]) -> None:
        """Answer every call waiting on this worker, and every later one, with make_error()."""
        self._calls.abort(make_error)

    def _relay(self, response: requests.Response) -> AnswerStream:
        try:
            for event in sse.iter_events(sse.iter_lines(response.iter_content(chunk_size=None))):
                if event.name == sse.ERROR:
                    data = event.json()
                    raise status_error(int(data["status"]), str(data["error"]), data.get("reason"))
                answer = from_sse(event)  # the hop's one parser: pieces whole, then the final answer
                if answer is not None:
                    yield answer
                    if isinstance(answer, FinalAnswer):
                        return
            raise PeerFailed(502, f"the stream of the worker at {self.base_url} ended without its reply")
        except (requests.RequestException, OSError, ValueError) as exc:
            aborted = self._calls.aborted()
            if aborted is not None:
                raise aborted from None
            raise NodeUnreachable(f"the stream of the worker at {self.base_url} broke: "
                                  f"{exc.__class__.__name__}") from None
        finally:
            self._calls.release(response)
            response.close()

    def _post(self, request: AnswerRequest, timeout_s: float) -> requests.Response:
        """The POST, its status checked, its body (the answer stream) left unread."""
        # Always the stream (a blocking caller collects it, and asks for no pieces past the first); the
        # time left goes along, so node 1 gives up when we do.
        body = {**request.wire(), "stream": True, "timeout_s": max(0.001, timeout_s)}
        # UTF-8 as the client sent it, not JSON's \u escapes (which triple most non-Latin text): a body
        # within node 0's MAX_BODY_BYTES stays within node 1's (plus FORWARD_SLACK_BYTES).
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        # The caller's X-Request-ID (this thread serves its /query), so node 1 logs the same id.
        trace = current_request_id.get()
        url = f"{self.base_url}/internal/answer"
        with tracing.client_span("POST /internal/answer", url, attributes={tracing.REQUEST_ID: trace}) as call:
            headers = {"Content-Type": "application/json", **({REQUEST_ID_HEADER: trace} if trace else {}),
                       **({} if request.stream else {PIECES_HEADER: "none"}), **call.headers}
            return post(self.session, url, f"worker at {self.base_url}", call,
                        f"did not answer within {timeout_s:.1f}s", data=data, headers=headers, stream=True,
                        timeout=(self.connect_timeout_s, timeout_s + WORKER_REPLY_GRACE_S))

    def health(self, timeout_s: float = 2.0) -> dict | None:
        """The worker's /health body when it is ready, else None."""
        try:
            response = self.session.get(f"{self.base_url}/health", timeout=(self.connect_timeout_s, timeout_s))
        except requests.RequestException:
            return None
        return response.json() if response.status_code == 200 else None

    def close(self) -> None:
        self._calls.close()
        self.session.close()
