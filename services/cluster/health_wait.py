"""Waiting for a node's GET /health to answer 200: the one loop the cluster launcher,
the client and the load tools share (services/ must not import profiling/)."""
from __future__ import annotations

import time
from typing import Callable

import requests


def health(url: str, request_timeout_s: float = 5.0) -> dict | None:
    """url/health's JSON body ({} when not a JSON object) if it answers 200, else None."""
    try:
        response = requests.get(f"{url}/health", timeout=request_timeout_s)
    except requests.RequestException:
        return None
    if response.status_code != 200:
        return None
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def wait_healthy(url: str, timeout_s: float, *, poll_s: float = 1.0, request_timeout_s: float = 5.0,
                 check: Callable[[], None] | None = None, ready: Callable[[dict], bool] | None = None) -> dict:
    """Poll url/health (at least once) until it answers 200 and `ready(body)` holds, and return its
    body; TimeoutError after timeout_s. `check` runs before every poll and may raise to give up."""
    until = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        body = health(url, request_timeout_s)
        if body is not None and (ready is None or ready(body)):
            return body
        left = until - time.monotonic()
        if left <= 0:
            what = "answer 200" if ready is None or body is None else "say it was ready"
            raise TimeoutError(f"{url}/health did not {what} within {timeout_s:.0f}s")
        time.sleep(min(poll_s, left))
