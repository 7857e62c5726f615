"""Bounded LRU caches with hit / miss / eviction counters: the workers' query embeddings and the
gateway's optional reply cache (off by default: valid only while models and documents are fixed).
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from services.roles.single_flight import Entry, SingleFlight
from services.server.answer import FinalAnswer
from services.server.deadline import Deadline
from services.server.errors import RequestTimeout
from services.server.stream_response import AnswerStream, relay, replay


@dataclass(frozen=True)
class CacheStats:
    name: str
    entries: int
    max_entries: int
    hits: int
    misses: int
    evictions: int
    joined: int = 0  # misses that waited for the same computation already in flight


class LruCache:
    """Bounded, optionally expiring; `refresh_on_read=False` makes it first-in first-out
    (eviction by age, and expired entries can then be purged from the front cheaply)."""

    def __init__(self, name: str, max_entries: int, ttl_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, *, refresh_on_read: bool = True):
        if max_entries < 0 or ttl_s < 0:
            raise ValueError("max_entries and ttl_s must be >= 0")
        self.name = name
        self.max_entries = max_entries
        self.ttl_s = ttl_s  # 0 = entries never expire
        self.refresh_on_read = refresh_on_read
        self._clock = clock
        self._data: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def get(self, key: Hashable, *, count_miss: bool = True) -> Any | None:
        """The value, or None; count_miss=False for a second look the caller already counted."""
        if not self.enabled:
            return None
        with self._lock:
            entry = self._data.get(key)
            if entry is not None and self.ttl_s and self._clock() - entry[0] > self.ttl_s:
                del self._data[key]
                entry = None
            if entry is None:
                self._misses += count_miss
                return None
            if self.refresh_on_read:
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

    def purge_expired(self) -> int:
        """Drop expired entries now rather than when looked up (first-in first-out order only)."""
        if not self.ttl_s or self.refresh_on_read:
            return 0
        dropped = 0
        with self._lock:
            now = self._clock()
            while self._data:
                stored_at, _ = next(iter(self._data.values()))
                if now - stored_at <= self.ttl_s:
                    break
                self._data.popitem(last=False)
                dropped += 1
        return dropped

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
    """Final answers by caller, normalised query and the conversation before it (its `conversation` key,
    AnswerRequest.conversation_key: "" without one), a hit re-addressed to the new request_id (each entry
    is one answer, kept as the worker gave it: RESPONSE_CACHE_SIZE bounds them by count). A question
    asked again by the same caller while it is computed joins that computation (single flight); a
    failure is never shared. The caller is the API key's identity (None without keys): one key never
    reads, joins nor learns of (a `cached` reply) another's question."""

    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.cache = LruCache("response", max_entries, ttl_s, clock)
        self.name = self.cache.name
        self._flights = SingleFlight()  # by (caller, normalised query, conversation)

    def get(self, request_id: str, query: str, *, caller: str | None = None, conversation: str = "",
            count_miss: bool = True) -> FinalAnswer | None:
        reply = self.cache.get(_key(caller, query, conversation), count_miss=count_miss)
        return None if reply is None else _readdress(reply, request_id)

    def put(self, query: str, reply: FinalAnswer, *, caller: str | None = None, conversation: str = "") -> None:
        self.cache.put(_key(caller, query, conversation), reply)

    def answer(self, request_id: str, query: str, compute: Callable[[], AnswerStream], deadline: Deadline, *,
               caller: str | None = None, conversation: str = "", looked_up: bool = False) -> AnswerStream:
        """The cached or joined reply, replayed; else `compute()`'s events as they come, its reply then
        cached. RequestTimeout when the computation joined has not ended by the request's deadline."""
        entry = self.enter(request_id, query, caller=caller, conversation=conversation, looked_up=looked_up)
        if entry.value is not None:
            yield from replay(entry.value)
            return
        if entry.joins:
            reply = self.joined_reply(entry, request_id, deadline)
            if reply is not None:
                yield from replay(reply)
                return
            # That computation failed: answer this one ourselves.
        yield from relay(compute, landed=lambda reply: self.finish(entry, reply),
                         failed=lambda exc: self.fail(entry, exc))

    def enter(self, request_id: str, query: str, *, caller: str | None = None, conversation: str = "",
              looked_up: bool = False) -> Entry:
        """Its reply (`value`), the computation to join, or the lead of a new one (`looked_up`: a miss
        was just counted). With the cache off: an empty Entry, compute alone."""
        if not self.cache.enabled:
            return Entry()
        # Lookup and leadership in one step: two askers cannot both lead.
        return self._flights.enter(_key(caller, query, conversation),
                                   lookup=lambda: self.get(request_id, query, caller=caller, conversation=conversation,
                                                           count_miss=not looked_up))

    def finish(self, entry: Entry, reply: FinalAnswer) -> None:
        """The leader's reply: cached, then handed to the joiners. Nothing for a non-leader."""
        if not entry.leads:
            return
        self.cache.put(entry.held.key, reply)  # before the flight lands: a new asker finds one or the other
        self._flights.finish(entry.held, reply)

    def fail(self, entry: Entry, error: BaseException) -> None:
        """The leader failed: its joiners are told (and compute their own). Nothing for a non-leader."""
        if entry.leads:
            self._flights.fail(entry.held, error)

    def joined_reply(self, entry: Entry, request_id: str, deadline: Deadline) -> FinalAnswer | None:
        """The leader's reply for this request, None if the leader failed; RequestTimeout past the deadline."""
        try:
            ended = self._flights.wait(entry.held, deadline.left())
        except TimeoutError:
            raise RequestTimeout("timed out waiting for the same question in flight") from None
        if ended.exception() is not None:
            return None
        return _readdress(ended.result(), request_id)

    def in_flight(self) -> int:
        return len(self._flights)

    def clear(self) -> int:
        return self.cache.clear()  # computations in flight finish and are cached as usual

    def stats(self) -> CacheStats:
        return dataclasses.replace(self.cache.stats(), joined=self._flights.stats().joined)


def _key(caller: str | None, query: str, conversation: str) -> tuple[str | None, str, str]:
    return caller, normalise_query(query), conversation


def _readdress(reply: FinalAnswer, request_id: str) -> FinalAnswer:
    # The entry keeps its leader's request_id; every reader gets its own.
    return dataclasses.replace(reply, request_id=request_id, cached=True)
