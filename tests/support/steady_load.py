"""A steady, bounded load on a gateway's /query for tests whose cluster changes under it: `clients`
threads, each sending one request after another; a 503 with Retry-After is retried (a client
honouring it would), anything else ends the request with that status. Each request's outcome is
kept, so a test can check that every one was answered."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import requests

from pipeline import spec

# A retried 503 waits this long at most, whatever Retry-After says: the test bounds its own time.
MAX_RETRY_PAUSE_S = 1.0


@dataclass
class Outcome:
    request_id: str
    status: int  # the last answer's status (0: no HTTP answer at all)
    retried_503s: int = 0  # 503s with Retry-After before it
    bare_503s: int = 0  # 503s without Retry-After: never acceptable
    detail: str = ""


@dataclass
class SteadyLoad:
    url: str
    clients: int = 3
    prefix: str = "steady"
    timeout_s: float = 120.0
    max_retries: int = 30
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(c,), daemon=True) for c in range(self.clients)]

    def start(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout_s: float = 300.0) -> list[Outcome]:
        """Let each client finish the request it is on; every outcome."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        assert not any(t.is_alive() for t in self._threads), "a load client is still waiting on its answer"
        return list(self.outcomes)

    def answered(self) -> int:
        with self._lock:
            return sum(o.status == 200 for o in self.outcomes)

    def _client(self, c: int) -> None:
        i = 0
        while not self._stop.is_set():
            outcome = self.send(f"{self.prefix}-{c}-{i}-{time.time_ns()}", spec.REFERENCE_QUERIES[(c + i) % 8])
            with self._lock:
                self.outcomes.append(outcome)
            i += 1

    def send(self, request_id: str, query: str) -> Outcome:
        outcome = Outcome(request_id, 0)
        for _ in range(self.max_retries + 1):
            try:
                response = requests.post(f"{self.url}/query", json={"request_id": request_id, "query": query},
                                         timeout=self.timeout_s)
            except requests.RequestException as exc:
                outcome.status, outcome.detail = 0, f"{type(exc).__name__}: {exc}"
                return outcome
            outcome.status = response.status_code
            if response.status_code != 503:
                outcome.detail = "" if response.status_code == 200 else response.text[:300]
                return outcome
            retry_after = response.headers.get("Retry-After")
            if retry_after is None:
                outcome.bare_503s += 1
                outcome.detail = response.text[:300]
                return outcome
            outcome.retried_503s += 1
            time.sleep(min(MAX_RETRY_PAUSE_S, float(retry_after)))
        outcome.detail = "still 503 after every retry"
        return outcome


def unanswered(outcomes: list[Outcome]) -> list[Outcome]:
    """The requests that did not end in a 200."""
    return [o for o in outcomes if o.status != 200]
