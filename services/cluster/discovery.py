"""Membership that changes while the service runs: a DNS name (a Kubernetes headless Service, a
compose service scaled to N) resolved to all its addresses, again every few seconds, each change
handed to whoever keeps the members (the gateway's router, a shard's index client).

A resolution that fails keeps the members last seen: a DNS hiccup must not empty a rotation, and
a member that really left fails its health probe (workers) or its calls (replicas) anyway.
"""
from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pipeline.config.parsers import Address
from pipeline.config.sections import ClusterSettings

log = logging.getLogger(__name__)


class Resolver(Protocol):
    def resolve(self, host: str) -> list[str]:
        """Every IP address `host` names; raises OSError when it cannot be resolved."""
        ...


class DnsResolver:
    """The system resolver (DNS, and /etc/hosts as the system's configuration says): the A records."""

    def resolve(self, host: str) -> list[str]:
        infos = socket.getaddrinfo(host, None, family=socket.AF_INET, proto=socket.IPPROTO_TCP)
        return sorted({str(info[4][0]) for info in infos})


class HostsFileResolver:
    """Names looked up in a hosts-style file (`IP name...` per line, # comments), read at every call,
    so editing it changes the members as a DNS record change would."""

    def __init__(self, path: Path):
        self.path = path

    def resolve(self, host: str) -> list[str]:
        found = set()
        for line in self.path.read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2 and host in fields[1:]:
                found.add(fields[0])
        if not found:
            raise OSError(f"{host} is not in {self.path}")
        return sorted(found)


def resolver_for(cluster: ClusterSettings) -> Resolver:
    """DISCOVERY_HOSTS_FILE's resolver where set, else DNS."""
    return HostsFileResolver(cluster.discovery_hosts_file) if cluster.discovery_hosts_file else DnsResolver()


class Membership:
    """The addresses `name` resolves to (each at name's port), kept current: `refresh()` resolves once
    and calls on_change(members) when they differ from the last; `start()` refreshes every interval_s
    on a thread of its own until `close()`."""

    def __init__(self, name: Address, resolver: Resolver, interval_s: float,
                 on_change: Callable[[list[Address]], None]):
        self.name = name
        self.resolver = resolver
        self.interval_s = interval_s
        self.on_change = on_change
        self.members: list[Address] | None = None  # None: never resolved
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> list[Address] | None:
        """Resolve once; the members (unchanged when the name cannot be resolved now)."""
        try:
            hosts = self.resolver.resolve(self.name.host)
        except OSError as exc:
            log.warning("cannot resolve %s (%s): keeping its %s members", self.name.host, exc,
                        "unknown" if self.members is None else len(self.members))
            return self.members
        members = [Address(host, self.name.port) for host in hosts]
        if members != self.members:
            log.info("%s resolves to %d members: %s", self.name.host, len(members),
                     " ".join(map(str, members)) or "none")
            self.members = members
            self.on_change(list(members))
        return self.members

    def start(self) -> Membership:
        """A first refresh now (so the caller starts with members), then one every interval_s."""
        self.refresh()
        self._thread = threading.Thread(target=self._run, name=f"discover-{self.name.host}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._closed.wait(self.interval_s):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the members' keeper failed on a change: try again next round
                log.exception("applying the members of %s failed", self.name.host)

    def close(self) -> None:
        self._closed.set()
