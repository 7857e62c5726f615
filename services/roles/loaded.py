"""What a role's load() builds, held for the routes: 503 until it is there."""
from __future__ import annotations

from typing import Generic, TypeVar

from services.server.errors import NodeNotReady

T = TypeVar("T")


class Loaded(Generic[T]):
    """Empty until `set` (the startup thread, once loaded); `require()` raises NodeNotReady
    (503 + Retry-After) until then, `value` is None until then."""

    def __init__(self, not_ready: str):
        self.not_ready = not_ready  # what a request is told meanwhile
        self.value: T | None = None

    def set(self, value: T) -> None:
        self.value = value

    def require(self) -> T:
        if self.value is None:
            raise NodeNotReady(self.not_ready)
        return self.value
