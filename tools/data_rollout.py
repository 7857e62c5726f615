"""Roll a running cluster over to another data version with no downtime: `./run.sh data-rollout VERSION`.

The version must already lie beside the current one on every machine (``<data root>/VERSION``, built by
``python -m builders.data build`` or ``update``, or copied there whole). Configured by the nodes' own
environment (NODE_<n>_IP, TOTAL_NODES, INDEX_NODES, CLUSTER_TOKEN, and WORKER_DISCOVERY / INDEX_DISCOVERY
where the nodes are found by name; --gateways where node 0 has replicas), run from any machine that
reaches them. In order, each step on every node before the next:

1. every index node loads its shard of VERSION beside the current one (the switch waits for every shard
   on every node that serves it);
2. every worker (node 0 too) loads VERSION's documents, checking that its embedder built it;
3. every worker switches: requests that start from now on read VERSION; those in flight finish on
   the version they started with (their searches name it, so the index nodes answer from it);
4. every worker releases the old versions once their requests in flight have ended; the gateways'
   reply caches are cleared;
5. every index node switches (for searches that name no version) and releases the old versions;
6. with --link, the data root's `current` link is repointed at VERSION (a node started from now on
   starts on it), where the nodes' own mounts are read-only;
7. every node is asked once more, names resolved again, and any that serves another version (it
   joined during the rollout) is brought through the steps above.

Discovered nodes are resolved again before each step (services.cluster.membership, the memberships the
gateway and the workers keep), and each step brings a node through the steps before it too, so one that joined
mid-rollout is caught up. Every step is idempotent, so a rollout that stopped anywhere (this tool or a
node killed) completes when run again. Exit 0 when every node serves VERSION alone, 1 naming the node that
failed, 2 on bad settings.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from pipeline.config import ConfigError, Settings
from pipeline.config.parsers import Address, address
from pipeline.config.sections import ClusterSettings
from pipeline.data_version import MANIFEST_NAME, DataVersionError, check_version_name, load_version, repoint_link
from services.cluster.discovery import Resolver, resolver_for
from services.cluster.membership import DnsSource, Membership, StaticSource, all_workers, shard_replicas
from services.server.token import TOKEN_HEADER

log = logging.getLogger("data-rollout")
# A node that does not answer (restarting) is asked again until this long has passed.
NODE_WAIT_S = 300.0
RETRY_PAUSE_S = 0.5
# What a step asks of a node, in order: a step also asks for every action before its own (each idempotent).
LOAD, SWITCH, RELEASE = "load", "switch", "release"
ACTIONS = (LOAD, SWITCH, RELEASE)
DONE = {LOAD: "%s loaded on %s", SWITCH: "%s current on %s", RELEASE: "%s alone on %s (the others released)"}
# How often the last step asks every node again when it keeps finding one on another version.
SETTLE_ROUNDS = 5


class RolloutFailed(RuntimeError):
    pass


class NodeLeft(RolloutFailed):
    """A discovered node that no longer answers and is no longer listed: it left, nothing to roll."""


@dataclass(frozen=True)
class Node:
    """One node a rollout calls: how the log names it, where it listens, and the membership it was
    found in."""
    name: str
    url: str
    found_by: Membership

    def listed(self) -> bool:
        """Still among its membership's members (read again now: a static node always is)."""
        return any(member.url == self.url for member in self.found_by.refresh() or [])


class Topology:
    """The nodes a rollout walks: the memberships the gateway and the workers keep (the static NODE_<n>_IP
    addresses, or whoever WORKER_DISCOVERY / INDEX_DISCOVERY, and `gateways`, name), read again at each
    call."""

    def __init__(self, cluster: ClusterSettings, resolver: Resolver, gateways: Address | None = None):
        gateway_source = (DnsSource(gateways, resolver) if gateways is not None
                          else StaticSource({0: cluster.node_address(0)}))
        self._gateways = Membership(gateway_source, cluster.discovery_interval_s)
        self._workers = all_workers(cluster, resolver)
        self._shards = shard_replicas(cluster, resolver)
        self.cluster = cluster

    def node(self, number: int) -> Node:
        """Node `number` at its NODE_<n>_IP (a static member, always listed)."""
        (member,) = _members(Membership(StaticSource({number: self.cluster.node_address(number)}), 0))
        return member

    def gateways(self) -> list[Node]:
        """Node 0: every gateway the `gateways` name lists, else NODE_0_IP."""
        return _members(self._gateways)

    def workers(self) -> list[Node]:
        """Every node that fetches documents: the gateways (each a worker too), then the workers."""
        return _unique(self.gateways() + _members(self._workers))

    def index_nodes(self) -> list[Node]:
        """Every replica of every shard."""
        return _unique([node for shard in self._shards for node in _members(shard)])


def _members(membership: Membership) -> list[Node]:
    """The membership's members, read now (those last seen if its source cannot be read now)."""
    members = membership.refresh()
    if members is None:
        raise RolloutFailed(f"cannot resolve {membership.source}: the nodes it should list cannot be rolled")
    source = membership.source
    found_as = f"{source.name.host} " if isinstance(source, DnsSource) else ""  # a static member: "node N"
    return [Node(f"{found_as}{member}", member.url, membership) for member in members]


def _unique(nodes: list[Node]) -> list[Node]:
    """The nodes in order, each address once (a gateway also listed as a worker is one node)."""
    unique: dict[str, Node] = {}
    for node in nodes:
        unique.setdefault(node.url, node)
    return list(unique.values())


class Rollout:
    def __init__(self, settings: Settings, version: str, *, release_timeout_s: float = 60.0,
                 node_wait_s: float = NODE_WAIT_S, resolver: Resolver | None = None,
                 gateways: Address | None = None, link: Path | None = None):
        self.settings = settings
        self.version = check_version_name(version)
        self.release_timeout_s = release_timeout_s
        self.node_wait_s = node_wait_s
        self.topology = Topology(settings.cluster, resolver or resolver_for(settings.cluster), gateways)
        self.link = link
        if link is not None:
            _check_link(link, self.version)
        self.session = requests.Session()
        token = settings.cluster.cluster_token
        if token:
            self.session.headers[TOKEN_HEADER] = token

    def run(self) -> None:
        self.step(self.topology.index_nodes, LOAD)
        self.step(self.topology.workers, LOAD)
        self.step(self.topology.workers, SWITCH)
        self.step(self.topology.workers, RELEASE)
        self.clear_caches()
        self.step(self.topology.index_nodes, RELEASE)
        if self.link is not None:
            # Pointed at the version directory's manifest, repoint_link moves the directory's link: the link.
            if not repoint_link(self.link / MANIFEST_NAME, self.version):
                raise RolloutFailed(f"every node serves {self.version}, but {self.link} could not be repointed "
                                    "(not writable here?): a node restarted now would start on the old version")
            log.info("%s -> %s: a node started from now on starts on it", self.link, self.version)
        self.settle()
        log.info("every node serves data version %s alone", self.version)

    def step(self, nodes: Sequence[Node] | Callable[[], Sequence[Node]], action: str) -> None:
        """Bring each node (a callable: resolved now) through every action up to `action`, in order."""
        listed = list(nodes() if callable(nodes) else nodes)
        done = [node.name for node in listed if self.advance(node, action)]
        log.info(DONE[action], self.version, ", ".join(done) or "no node")

    def advance(self, node: Node, action: str) -> bool:
        """Load, switch and release up to `action` on one node; False if it left meanwhile."""
        try:
            for each in ACTIONS[:ACTIONS.index(action) + 1]:
                if each == RELEASE:
                    self.release_old(node)
                else:
                    self.call(node, "POST", f"/data/{each}", {"version": self.version})
        except NodeLeft as gone:
            log.info("%s", gone)
            return False
        return True

    def release_old(self, node: Node) -> None:
        """Every version but this one released on the node, once its requests in flight end."""
        for entry in self.call(node, "GET", "/data", None).get("loaded", []):
            old = entry["version"]
            if old != self.version:
                self.call(node, "POST", "/data/release", {"version": old, "timeout_s": self.release_timeout_s})
                log.info("%s released data version %s", node.name, old)

    def clear_caches(self) -> None:
        """The gateways' reply caches: a reply kept from the old version must not be given again."""
        for gateway in self.topology.gateways():
            try:
                self.call(gateway, "POST", "/cache/clear", None)
            except NodeLeft:
                continue

    def serves_alone(self, node: Node) -> bool:
        try:
            status = self.call(node, "GET", "/data", None)
        except NodeLeft:
            return True
        return status.get("current") == self.version and \
            [entry["version"] for entry in status.get("loaded", [])] == [self.version]

    def settle(self) -> None:
        """Ask every node (resolved again) until none serves another version: one that joined during the
        rollout started on the old one, and is brought through every step (workers before index nodes,
        so no search still names a version an index node then releases)."""
        for _ in range(SETTLE_ROUNDS):
            workers = [node for node in self.topology.workers() if not self.serves_alone(node)]
            index_nodes = [node for node in self.topology.index_nodes() if not self.serves_alone(node)]
            if not workers and not index_nodes:
                return
            log.info("nodes on another version (joined during the rollout): %s",
                     ", ".join(node.name for node in workers + index_nodes))
            self.step(workers, RELEASE)
            if workers:
                self.clear_caches()
            self.step(index_nodes, RELEASE)
        raise RolloutFailed(f"nodes still joined on another version after {SETTLE_ROUNDS} rounds; run it again")

    def call(self, node: Node, method: str, path: str, body: dict | None) -> dict:
        """One call, asked again while the node is down, starting or busy (503), until node_wait_s;
        NodeLeft if a discovered node stops answering and is no longer listed."""
        deadline = time.monotonic() + self.node_wait_s
        while True:
            try:
                response = self.session.request(method, f"{node.url}{path}", json=body,
                                                timeout=(3.0, self.release_timeout_s + 30))
            except requests.RequestException as exc:
                problem = f"unreachable ({exc.__class__.__name__})"
                if not node.listed():
                    raise NodeLeft(f"{node.name} left (no longer listed): skipped") from None
            else:
                if response.status_code == 200:
                    return response.json()
                problem = f"{response.status_code}: {_error(response)}"
                if response.status_code != 503:
                    raise RolloutFailed(f"{node.name} {method} {path} {body or ''} answered {problem}")
            if time.monotonic() > deadline:
                raise RolloutFailed(f"{node.name} {method} {path}: {problem} for {self.node_wait_s:g}s")
            log.info("%s %s %s: %s; asking again", node.name, method, path, problem)
            time.sleep(RETRY_PAUSE_S)

    def close(self) -> None:
        self.session.close()


def _check_link(link: Path, version: str) -> None:
    """--link must be a link in the data root, and the version complete beside it (ValueError otherwise)."""
    if not link.is_symlink():
        raise ValueError(f"--link {link} is not a symbolic link (the data root's `current`, which the nodes' "
                         "FAISS_INDEX_PATH and DOCUMENTS_DIR go through)")
    try:
        load_version(link.parent / version)
    except DataVersionError as exc:
        raise ValueError(f"data version {version} is not complete beside {link}: {exc}") from None


def _error(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", response.text[:200]))
    except ValueError:
        return response.text[:200]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run.sh data-rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="the data version to serve: a directory beside the current one")
    parser.add_argument("--release-timeout-s", type=float, default=60.0,
                        help="how long a node waits for the old version's requests in flight, per call")
    parser.add_argument("--node-wait-s", type=float, default=NODE_WAIT_S,
                        help="how long a node that does not answer (restarting) is asked again")
    parser.add_argument("--gateways", type=address, metavar="HOST:PORT",
                        help="a name that resolves to every gateway (node 0 replicas: a headless Service); "
                             "default: NODE_0_IP, one gateway")
    parser.add_argument("--link", type=Path, metavar="DATA_ROOT/current",
                        help="once every node serves VERSION, repoint this link at it (atomically), so a node "
                             "started afterwards starts on it: the link the nodes' data paths go through, "
                             "where this tool may write it (their own mounts are read-only)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s data-rollout %(levelname)s: %(message)s")
    try:
        settings = Settings.from_env()
        rollout = Rollout(settings, args.version, release_timeout_s=args.release_timeout_s,
                          node_wait_s=args.node_wait_s, gateways=args.gateways, link=args.link)
    except (ConfigError, ValueError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    try:
        rollout.run()
    except RolloutFailed as exc:
        log.error("%s; every step is idempotent: run the same command again once fixed", exc)
        return 1
    finally:
        rollout.close()
    print(f"SERVING {args.version}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
