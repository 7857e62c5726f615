"""Name resolution for membership by DNS (services.cluster.membership.DnsSource): a name (a Kubernetes
headless Service, a compose service scaled to N) to all its addresses, through the system resolver or
a hosts-style file."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Protocol

from pipeline.config.sections import ClusterSettings


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
