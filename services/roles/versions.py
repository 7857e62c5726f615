"""The data versions a node holds (pipeline.data_version): the current one, any loaded beside it, and
how many requests use each, so a request reads one version end to end and an old version is closed only
once the last request that uses it ends.

Every node that holds data (a worker's documents, an index node's shard) keeps one VersionSet; its
/data routes (services.roles.data_routes) load, switch and release versions on a rollout's orders.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from services.server.errors import ApiError

T = TypeVar("T")


class VersionUnavailable(ApiError):
    """A request names a version this node does not hold: 503, so a search tries another replica."""

    def __init__(self, message: str):
        super().__init__(503, message, retry_after_s=1.0)


@dataclass
class _Held(Generic[T]):
    value: T
    in_flight: int = 0
    releasing: bool = False


@dataclass(frozen=True)
class Lease(Generic[T]):
    """One request's hold on a version: its value stays open until the lease is released."""
    version: str
    value: T
    release: Callable[[], None]


class VersionSet(Generic[T]):
    """Versions by id, one current; `close(value)` ends a released one."""

    def __init__(self, close: Callable[[T], None]):
        self._close = close
        self._held: dict[str, _Held[T]] = {}
        self._current: str | None = None
        self._changed = threading.Condition()

    @property
    def current(self) -> str | None:
        with self._changed:
            return self._current

    def has(self, version: str) -> bool:
        with self._changed:
            held = self._held.get(version)
            return held is not None and not held.releasing

    def add(self, version: str, value: T, *, current: bool = False) -> bool:
        """Hold `value` as `version` (False, and `value` closed, if that version is already held)."""
        with self._changed:
            held = self._held.get(version)
            if held is not None and not held.releasing:
                duplicate = True
            else:
                duplicate = False
                # Loaded again while a release waits on the old copy: the new one serves, the release
                # still closes the old one.
                self._held[version] = _Held(value)
                if current or self._current is None:
                    self._current = version
                self._changed.notify_all()
        if duplicate:
            self._close(value)
        return not duplicate

    def switch(self, version: str) -> None:
        """New requests use `version` from now on (it must be held)."""
        with self._changed:
            if version not in self._held or self._held[version].releasing:
                raise VersionUnavailable(f"data version {version!r} is not loaded here; load it first")
            self._current = version

    def acquire(self, version: str | None = None) -> Lease[T]:
        """A hold on `version` (None: the current one); VersionUnavailable if it is not held."""
        with self._changed:
            name = self._current if version is None else version
            held = self._held.get(name) if name is not None else None
            if held is None or held.releasing or name is None:
                raise VersionUnavailable(f"data version {name!r} is not loaded on this node"
                                         if name is not None else "no data version is loaded yet")
            held.in_flight += 1
        released = threading.Event()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            with self._changed:
                held.in_flight -= 1
                self._changed.notify_all()

        return Lease(name, held.value, release)

    @contextmanager
    def use(self, version: str | None = None) -> Iterator[Lease[T]]:
        lease = self.acquire(version)
        try:
            yield lease
        finally:
            lease.release()

    def release(self, version: str, timeout_s: float) -> bool:
        """Stop handing out `version`, wait for its requests in flight to end (up to timeout_s), close
        it; True once closed (or not held at all). The current version cannot be released."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            if version == self._current:
                raise ApiError(409, f"data version {version!r} is the current one; switch to another first",
                               field="version")
            held = self._held.get(version)
            if held is None:
                return True
            held.releasing = True
            while held.in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            if self._held.get(version) is held:
                del self._held[version]
        self._close(held.value)
        return True

    def status(self) -> dict:
        """What /data shows: the current version and each one held, with its requests in flight."""
        with self._changed:
            return {"current": self._current,
                    "loaded": [{"version": name, "in_flight": held.in_flight, "releasing": held.releasing}
                               for name, held in self._held.items()]}

    def values(self) -> list[T]:
        with self._changed:
            return [held.value for held in self._held.values()]

    def close(self) -> None:
        with self._changed:
            held, self._held, self._current = list(self._held.values()), {}, None
        for h in held:
            self._close(h.value)
