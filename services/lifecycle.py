"""A node's readiness, shared by its HTTP handlers and its startup thread."""
from __future__ import annotations

import threading


class Readiness:
    STARTING, READY, FAILED, STOPPING = "starting", "ready", "failed", "stopping"

    def __init__(self):
        self._state = self.STARTING
        self._detail = ""
        self._lock = threading.Lock()

    def set(self, state: str, detail: str = "") -> None:
        with self._lock:
            self._state, self._detail = state, detail

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    @property
    def detail(self) -> str:
        with self._lock:
            return self._detail

    @property
    def ready(self) -> bool:
        return self.state == self.READY
