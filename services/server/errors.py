"""Every error a node can meet on a request's way, and the one table that turns it into HTTP.

Domain code raises these; `http_answer(exc)` is the single place an error becomes a status, a
public message, a field and a `Retry-After`. A type not in the table is a bug: 500, logged with
its traceback, its text not shown to the caller.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# How long a caller should wait before retrying a node that is starting, stopping or has
# no worker to offer: about one gateway health probe plus a margin.
NOT_READY_RETRY_AFTER_S = 5.0
# What a caller is told when another node fails its request (the details go to the log only).
PEER_UNAVAILABLE = "a node this request needs is unavailable"
PEER_FAILED = "internal error on a node this request needs"


# ---------------------------------------------------------------- the caller's mistakes

class ApiError(Exception):
    """An error meant for the caller as it is: status code, message, optional field and Retry-After,
    and a machine-readable `code` where a client tells refusals apart by it (OpenAI's clients do)."""

    def __init__(self, status: int, message: str, *, field: str | None = None,
                 retry_after_s: float | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s
        self.code = code


class RequestIdConflict(ApiError):
    """A request_id already used with another query: 409. The id is bound to its exact query, or
    anyone who guesses an id could read or plant its answer."""

    def __init__(self, request_id: str):
        super().__init__(409, "'query' differs from the query this request_id was first sent with: "
                              "a request_id is bound to its exact query; send a new request_id", field="query")


# ---------------------------------------------------------------- capacity and lifecycle

class Overloaded(RuntimeError):
    """A queue or the gateway is full; the work was not accepted (503 + Retry-After: `retry_after_s`)."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = float(retry_after_s)

    def __reduce__(self):
        # BaseException pickles only `args`; keep the hint across processes.
        return (type(self), (str(self), self.retry_after_s))


class ServiceClosed(RuntimeError):
    """A stage service is closed, or shut down before the item could run (503: stopping)."""


class StageDown(ServiceClosed):
    """A stage's thread died: the stage takes no work and failed what it held (503; /health unhealthy).
    A ServiceClosed, so the gateway tries another worker; `public` is what the caller is told."""

    def __init__(self, stage: str, reason: str):
        super().__init__(f"the {stage} stage stopped: {reason}")
        self.public = f"the {stage} stage of this node has stopped; the node is unhealthy"


class NodeNotReady(RuntimeError):
    """This node is starting, stopping or failed (503 + Retry-After)."""


class NoWorkerAvailable(RuntimeError):
    """No worker could take the request (all down, not ready or full): 503."""


# ---------------------------------------------------------------- one request's failures

class RequestTimeout(TimeoutError):
    """The request's deadline passed; its unstarted work was cancelled (504)."""


class BatchSizeMismatch(RuntimeError):
    """A batch function did not return exactly one result per input item (a bug: 500)."""


class StageFailed(RuntimeError):
    """One stage failed this request. Wrapped, so that node 2 unreachable never reads upstream as
    *this* worker unreachable."""

    def __init__(self, stage: str, cause: BaseException):
        super().__init__(f"{stage} stage failed: {type(cause).__name__}: {cause}")


class WorkerFailed(RuntimeError):
    """The worker computing the request failed it (500); `public` is what the client is told."""

    def __init__(self, node: int | str, detail: str):  # str: a discovered worker's address
        super().__init__(f"worker node {node} failed the request: {detail}")
        self.public = f"internal error on worker node {node}"


# ---------------------------------------------------------------- node-to-node calls

class NodeUnreachable(RuntimeError):
    """The other node could not be reached (refused, reset, connect timeout)."""


class DeadlineExceeded(TimeoutError):
    """The caller's deadline passed (or left no room for another attempt) before an answer came."""


class PeerTimedOut(TimeoutError):
    """The other node did not answer in time: its own 504, or our read timeout (the work may be in flight there)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class PeerError(RuntimeError):
    """The other node answered with an error status; `message` is its own words, str() adds the status."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.message = message


class PeerUnavailable(PeerError):
    """The other node answered 503: starting, stopping or full; it computed nothing."""

    def __init__(self, message: str):
        super().__init__(503, message)


class PeerRejected(PeerError):
    """The other node refused our request (a 4xx): our request was wrong, so retrying cannot help."""


class PeerRejectedToken(PeerRejected):
    """The other node refused our cluster token (401): CLUSTER_TOKEN differs between the nodes."""

    def __init__(self, message: str):
        super().__init__(401, message)


class PeerFailed(PeerError):
    """The other node failed our request (a 5xx other than 503 and 504)."""


# The `reason` of a 503 a worker answers when an index shard is down (ShardUnavailable): the
# gateway tells it from a worker that is itself unavailable (which leaves the rotation).
SHARD_UNAVAILABLE_REASON = "index_shard_unavailable"


class ShardUnavailable(RuntimeError):
    """Every replica of an index shard stayed unreachable or failing until the request's deadline:
    no answer from a part of the index, so none at all (503, never a partial top 10)."""


class PeerShardUnavailable(PeerError):
    """Another worker answered 503 because an index shard is down (its reason says so)."""

    def __init__(self, message: str):
        super().__init__(503, message)


# ---------------------------------------------------------------- the table

@dataclass(frozen=True)
class HttpAnswer:
    """What the caller is told about an error, and how loudly the node logs it."""
    status: int
    message: str
    field: str | None = None
    retry_after_s: float | None = None
    log_level: int | None = None  # None: not logged here (the caller's own mistake, or logged where raised)
    reason: str | None = None  # a machine-readable reason in the body, for the node that called
    code: str | None = None  # a machine-readable code for the caller (OpenAI's `code`); None: the status's


# Most specific first: the first entry whose type matches decides.
_TABLE: list[tuple[type[BaseException], Callable[[Any], HttpAnswer]]] = [
    (ApiError, lambda e: HttpAnswer(e.status, e.message, e.field, e.retry_after_s, code=e.code)),
    (Overloaded, lambda e: HttpAnswer(503, f"overloaded: {e}", retry_after_s=e.retry_after_s or 1.0,
                                      log_level=logging.WARNING)),
    (StageDown, lambda e: HttpAnswer(503, e.public, retry_after_s=NOT_READY_RETRY_AFTER_S, log_level=logging.ERROR)),
    (ServiceClosed, lambda e: HttpAnswer(503, "shutting down", retry_after_s=NOT_READY_RETRY_AFTER_S)),
    (NodeNotReady, lambda e: HttpAnswer(503, str(e), retry_after_s=NOT_READY_RETRY_AFTER_S)),
    (NoWorkerAvailable, lambda e: HttpAnswer(503, str(e), retry_after_s=NOT_READY_RETRY_AFTER_S,
                                             log_level=logging.WARNING)),
    # A peer's error the gateway or the worker did not translate: the caller is told as little as
    # for WorkerFailed; the peer's address and words stay in the log.
    (NodeUnreachable, lambda e: HttpAnswer(503, PEER_UNAVAILABLE, retry_after_s=NOT_READY_RETRY_AFTER_S,
                                           log_level=logging.WARNING)),
    (ShardUnavailable, lambda e: HttpAnswer(503, str(e), retry_after_s=NOT_READY_RETRY_AFTER_S,
                                            log_level=logging.WARNING, reason=SHARD_UNAVAILABLE_REASON)),
    (PeerShardUnavailable, lambda e: HttpAnswer(503, e.message, retry_after_s=NOT_READY_RETRY_AFTER_S,
                                                reason=SHARD_UNAVAILABLE_REASON)),
    (PeerUnavailable, lambda e: HttpAnswer(503, PEER_UNAVAILABLE, retry_after_s=NOT_READY_RETRY_AFTER_S,
                                           log_level=logging.WARNING)),
    # The reference's exact 504 body: clients match on it. (PeerTimedOut and DeadlineExceeded too.)
    (TimeoutError, lambda e: HttpAnswer(504, "Request timeout", log_level=logging.WARNING)),
    (WorkerFailed, lambda e: HttpAnswer(500, e.public, log_level=logging.ERROR)),
    (StageFailed, lambda e: HttpAnswer(500, str(e), log_level=logging.ERROR)),
    (PeerError, lambda e: HttpAnswer(500, PEER_FAILED, log_level=logging.ERROR)),
]


def http_answer(exc: BaseException) -> HttpAnswer | None:
    """The HTTP answer for a known error; None for anything else (a bug: the app answers 500)."""
    for kind, answer in _TABLE:
        if isinstance(exc, kind):
            return answer(exc)
    return None
