"""Node-to-node calls over HTTP with pooled `requests` sessions and timeouts.

JSON only between nodes. Search calls are idempotent, so they are retried
with backoff and jitter on connection errors and 5xx, within a deadline.
"""
from __future__ import annotations

import logging
import random
import time
from typing import Sequence

import numpy as np
import requests
from requests.adapters import HTTPAdapter

log = logging.getLogger(__name__)


class NodeUnreachable(RuntimeError):
    """The other node could not be reached (refused, reset, connect timeout)."""


class NodeError(RuntimeError):
    """The other node answered with an error status."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def pooled_session(pool_size: int) -> requests.Session:
    session = requests.Session()
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _error_message(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", response.text[:200]))
    except ValueError:
        return response.text[:200]


class IndexClient:
    def __init__(self, base_url: str, *, connect_timeout_s: float, read_timeout_s: float,
                 pool_size: int = 16, max_attempts: int = 5, backoff_s: float = 0.2):
        self.base_url = base_url.rstrip("/")
        self.timeout = (connect_timeout_s, read_timeout_s)
        self.session = pooled_session(pool_size)
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s

    def search(self, vectors: np.ndarray | Sequence[Sequence[float]], k: int,
               deadline: float | None = None) -> tuple[list[list[int]], list[list[float]]]:
        payload = {"embeddings": np.asarray(vectors, dtype=np.float32).tolist(), "k": k}
        for attempt in range(1, self.max_attempts + 1):
            try:
                response = self.session.post(f"{self.base_url}/search", json=payload, timeout=self.timeout)
                if response.status_code == 200:
                    body = response.json()
                    return body["ids"], body["distances"]
                error: Exception = NodeError(response.status_code, _error_message(response))
                if response.status_code < 500:
                    raise error  # our request was wrong: retrying cannot help
            except requests.ConnectionError as exc:
                error = NodeUnreachable(f"index server at {self.base_url} unreachable: {exc.__class__.__name__}")
            except requests.Timeout:
                error = NodeUnreachable(f"index server at {self.base_url} timed out")
            pause = self.backoff_s * (2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
            if attempt == self.max_attempts or (deadline is not None and time.monotonic() + pause > deadline):
                raise error
            log.warning("search attempt %d failed (%s); retrying in %.2fs", attempt, error, pause)
            time.sleep(pause)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.session.close()


class WorkerClient:
    """The gateway's handle on a remote worker's internal answer endpoint."""

    def __init__(self, base_url: str, *, connect_timeout_s: float, pool_size: int = 64):
        self.base_url = base_url.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.session = pooled_session(pool_size)

    def answer(self, request_id: str, query: str, timeout_s: float) -> dict:
        try:
            response = self.session.post(f"{self.base_url}/internal/answer",
                                         json={"request_id": request_id, "query": query},
                                         timeout=(self.connect_timeout_s, max(0.1, timeout_s)))
        except requests.ConnectionError as exc:  # includes connect timeouts: nothing was sent
            raise NodeUnreachable(f"worker at {self.base_url} unreachable: {exc.__class__.__name__}") from None
        except requests.Timeout:  # a read timeout: the work may be in flight there
            raise TimeoutError(f"worker at {self.base_url} did not answer within {timeout_s:.1f}s") from None
        if response.status_code != 200:
            raise NodeError(response.status_code, _error_message(response))
        return response.json()

    def health(self, timeout_s: float = 2.0) -> dict | None:
        """The worker's /health body when it is ready, else None."""
        try:
            response = self.session.get(f"{self.base_url}/health", timeout=(self.connect_timeout_s, timeout_s))
        except requests.RequestException:
            return None
        return response.json() if response.status_code == 200 else None

    def close(self) -> None:
        self.session.close()
