"""Single flight: at most one computation per key at a time. The first caller leads and ends the
flight (`finish` or `fail`); later ones join and `wait` for its outcome. The callers' own rules
(a value already known, who may join, who may lead) run under the map's lock, atomic with the lookup.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Flight:
    """One key being computed: its leader ends `future`, its `joiners` wait on it; `meta` is what
    the leader said about it (a digest its joiners must match)."""
    key: Hashable
    meta: Any = None
    started: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)
    joiners: int = 0


@dataclass(frozen=True)
class Entry:
    """A caller's place after `enter`: a known `value` (answered, no flight), or the flight it
    leads or joins. Neither (the default): compute alone, nothing is shared."""
    value: Any = None
    flight: Flight | None = None
    leads: bool = False

    @property
    def joins(self) -> bool:
        return self.flight is not None and not self.leads

    @property
    def held(self) -> Flight:
        """The flight this entry leads or joins (an entry with a value, or none, holds no flight)."""
        if self.flight is None:
            raise RuntimeError("this entry holds no flight")
        return self.flight


@dataclass(frozen=True)
class FlightStats:
    in_flight: int  # keys being computed now
    joining: int  # callers waiting on them now
    joined: int  # callers that ever joined one


class SingleFlight:
    """Keyed computations in flight, with their joiners; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[Hashable, Flight] = {}
        self._joining = self._joined = 0

    def enter(self, key: Hashable, *, meta: Any = None,
              lookup: Callable[[], Any] | None = None,
              admit_joiner: Callable[[Flight, int], None] | None = None,
              admit_leader: Callable[[int], Any] | None = None) -> Entry:
        """Under one lock: a known value from `lookup()` answers; else the key in flight is joined
        (`admit_joiner(flight, joining)` may raise); else `admit_leader(in_flight)` may raise or
        answer with a value; else the caller leads. The callbacks must be quick and not call back."""
        with self._lock:
            if lookup is not None and (value := lookup()) is not None:
                return Entry(value=value)
            flight = self._flights.get(key)
            if flight is not None:
                if admit_joiner is not None:
                    admit_joiner(flight, self._joining)
                flight.joiners += 1
                self._joining += 1
                self._joined += 1
                return Entry(flight=flight)
            if admit_leader is not None and (value := admit_leader(len(self._flights))) is not None:
                return Entry(value=value)
            flight = self._flights[key] = Flight(key, meta)
            return Entry(flight=flight, leads=True)

    def finish(self, flight: Flight, value: Any) -> None:
        """The leader's value: the key leaves the map, then its joiners get the value."""
        self._land(flight)
        flight.future.set_result(value)

    def fail(self, flight: Flight, error: BaseException) -> None:
        """The leader's failure: the key leaves the map, then its joiners get the error."""
        self._land(flight)
        flight.future.set_exception(error)

    def _land(self, flight: Flight) -> None:
        with self._lock:
            if self._flights.get(flight.key) is flight:
                del self._flights[flight.key]

    def wait(self, flight: Flight, timeout_s: float) -> Future:
        """The joined flight's ended future; TimeoutError if it has not ended within timeout_s."""
        try:
            flight.future.exception(timeout=max(0.0, timeout_s))  # waits; the outcome is the caller's to read
            return flight.future
        finally:
            with self._lock:
                flight.joiners -= 1
                self._joining -= 1

    def __len__(self) -> int:
        with self._lock:
            return len(self._flights)

    def stats(self) -> FlightStats:
        with self._lock:
            return FlightStats(len(self._flights), self._joining, self._joined)
