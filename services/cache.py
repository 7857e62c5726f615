"""Bounded LRU caches with hit / miss / eviction counters, for /metrics.

Two uses: the workers' query-embedding cache (an embedding depends only on the
query text and the embedder), and the gateway's optional response cache, keyed
by the normalised query. The response cache is off by default: answers can be
cached only while the models and the documents stay fixed.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable


@dataclass(frozen=True)
class CacheStats:
    name: str
    entries: int
    max_entries: int
    hits: int
    misses: int
    evictions: int


class LruCache:
    def __init__(self, name: str, max_entries: int, ttl_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        if max_entries < 0 or ttl_s < 0:
            raise ValueError("max_entries and ttl_s must be >= 0")
        self.name = name
        self.max_entries = max_entries
        self.ttl_s = ttl_s  # 0 = entries never expire
        self._clock = clock
        self._data: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def get(self, key: Hashable) -> Any | None:
        if not self.enabled:
            return None
        with self._lock:
            entry = self._data.get(key)
            if entry is not None and self.ttl_s and self._clock() - entry[0] > self.ttl_s:
                del self._data[key]
                entry = None
            if entry is None:
                self._misses += 1
                return None
            self._data.move_to_end(key)
            self._hits += 1
            return entry[1]

    def put(self, key: Hashable, value: Any) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._data[key] = (self._clock(), value)
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)
                self._evictions += 1

    def clear(self) -> int:
        with self._lock:
            n = len(self._data)
            self._data.clear()
            return n

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self.name, len(self._data), self.max_entries, self._hits, self._misses,
                              self._evictions)


def normalise_query(query: str) -> str:
    """Case and spacing do not change a question; anything else does."""
    return " ".join(query.lower().split())


class ResponseCache:
    """Replies by normalised query; a hit is re-addressed to the new request_id."""

    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.cache = LruCache("response", max_entries, ttl_s, clock)

    def get(self, request_id: str, query: str) -> dict | None:
        reply = self.cache.get(normalise_query(query))
        return None if reply is None else {**reply, "request_id": request_id, "cached": True}

    def put(self, query: str, reply: dict) -> None:
        self.cache.put(normalise_query(query), {k: v for k, v in reply.items() if k != "request_id"})
