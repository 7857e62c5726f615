"""Who serves a role (the gateway's workers, an index shard's replicas): one `Membership` per role,
whose members come from a source. A static list (the NODE_<n>_IP addresses the settings place) is one
source; a DNS name (a Kubernetes headless Service, a compose service scaled to N), resolved again
every few seconds, is another. Whoever keeps the members (the gateway's router, a shard's index
client) subscribes to one membership and never asks which source it has.

A source that cannot be read now keeps the members last seen: a DNS hiccup must not empty a
rotation, and a member that really left fails its health probe (workers) or its calls (replicas)
anyway.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pipeline.config.parsers import Address
from pipeline.config.sections import ClusterSettings
from services.cluster.discovery import Resolver, resolver_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Member:
    """One member: its name (a static node's number; a discovered one's address) and its address."""
    name: int | str
    address: Address

    @property
    def url(self) -> str:
        return self.address.url

    def __str__(self) -> str:
        return self.name if isinstance(self.name, str) else f"node {self.name}"


class Source(Protocol):
    """Where a membership's members come from."""

    changes: bool  # False: reading it again can never give other members (no refresh thread needed)

    def read(self) -> list[Member]:
        """The members now; raises OSError when they cannot be known now."""
        ...


class StaticSource:
    """Numbered nodes at fixed addresses (NODE_<n>_IP), in the order given."""

    changes = False

    def __init__(self, nodes: Mapping[int, Address]):
        self.members = [Member(n, address) for n, address in nodes.items()]

    def read(self) -> list[Member]:
        return list(self.members)

    def __str__(self) -> str:
        return "nodes " + (",".join(str(m.name) for m in self.members) or "none")


class DnsSource:
    """Every address a name resolves to, each at the name's port, named by its address."""

    changes = True

    def __init__(self, name: Address, resolver: Resolver):
        self.name, self.resolver = name, resolver

    def read(self) -> list[Member]:
        return [Member(str(address), address)
                for address in (Address(host, self.name.port) for host in self.resolver.resolve(self.name.host))]

    def __str__(self) -> str:
        return str(self.name)


class Joined:
    """Several sources' members, in order, each address once (the gateway's own worker beside the
    workers a name lists). Unreadable when any part is."""

    def __init__(self, *sources: Source):
        self.sources = sources
        self.changes = any(source.changes for source in sources)

    def read(self) -> list[Member]:
        seen: dict[Address, Member] = {}
        for source in self.sources:
            for member in source.read():
                seen.setdefault(member.address, member)
        return list(seen.values())

    def __str__(self) -> str:
        return " + ".join(map(str, self.sources))


class Membership:
    """A source's members, kept current: `refresh()` reads it once and tells every subscriber the
    members when they differ from the last; `start()` refreshes now, then (a source that changes)
    every interval_s on a thread of its own until `close()`."""

    def __init__(self, source: Source, interval_s: float):
        self.source = source
        self.interval_s = interval_s
        self.members: list[Member] | None = None  # None: never read
        self._subscribers: list[Callable[[list[Member]], None]] = []
        self._lock = threading.Lock()  # one refresh at a time: subscribers see the changes in order
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def subscribe(self, on_change: Callable[[list[Member]], None]) -> Membership:
        """on_change(members) at every change from now on (and now, with the members already known)."""
        with self._lock:
            self._subscribers.append(on_change)
            if self.members is not None:
                on_change(list(self.members))
        return self

    def refresh(self) -> list[Member] | None:
        """Read the source once; the members (unchanged when it cannot be read now)."""
        with self._lock:
            try:
                members = self.source.read()
            except OSError as exc:
                log.warning("cannot read the members of %s (%s): keeping its %s members", self.source, exc,
                            "unknown" if self.members is None else len(self.members))
                return self.members
            if members != self.members:
                log.info("%s: %d members: %s", self.source, len(members), " ".join(map(str, members)) or "none")
                self.members = members
                for on_change in self._subscribers:
                    on_change(list(members))
            return self.members

    def start(self) -> Membership:
        """A first refresh now (so the subscribers start with members), then, where the source can
        change, one every interval_s."""
        self.refresh()
        if self.source.changes:
            self._thread = threading.Thread(target=self._run, name=f"members-{self.source}", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._closed.wait(self.interval_s):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - a subscriber failed on a change: try again next round
                log.exception("applying the members of %s failed", self.source)

    def close(self) -> None:
        self._closed.set()


# ---------------------------------------------------------------- each role's members, as the settings name them

def _static(cluster: ClusterSettings, nodes: Sequence[int]) -> StaticSource:
    return StaticSource({n: cluster.node_address(n) for n in nodes})


def gateway_workers(cluster: ClusterSettings, own: int = 0, resolver: Resolver | None = None) -> Membership:
    """The workers a gateway (node `own`) round-robins over: the rotation's NODE_<n>_IP addresses, or
    (WORKER_DISCOVERY) its own worker, if in the rotation, beside whoever that name lists."""
    if cluster.worker_discovery is None:
        source: Source = _static(cluster, cluster.rotation)
    else:
        source = Joined(_static(cluster, [own] if own in cluster.rotation else []),
                        DnsSource(cluster.worker_discovery, resolver or resolver_for(cluster)))
    return Membership(source, cluster.discovery_interval_s)


def all_workers(cluster: ClusterSettings, resolver: Resolver | None = None) -> Membership:
    """Every worker but node 0 (rotation or not): the NODE_<n>_IP addresses, or whoever WORKER_DISCOVERY
    lists."""
    source: Source = (_static(cluster, [n for n in cluster.workers if n != 0]) if cluster.worker_discovery is None
                      else DnsSource(cluster.worker_discovery, resolver or resolver_for(cluster)))
    return Membership(source, cluster.discovery_interval_s)


def shard_replicas(cluster: ClusterSettings, resolver: Resolver | None = None) -> list[Membership]:
    """Each index shard's replicas, in shard order: the INDEX_NODES serving it, or (INDEX_DISCOVERY)
    whoever the shard's name lists."""
    if not cluster.index_discovery:
        return [Membership(_static(cluster, cluster.replicas(shard)), cluster.discovery_interval_s)
                for shard in range(cluster.index_shards)]
    resolver = resolver or resolver_for(cluster)
    return [Membership(DnsSource(name, resolver), cluster.discovery_interval_s) for name in cluster.index_discovery]
