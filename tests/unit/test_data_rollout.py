"""tools/data_rollout.py's walk, with a fake resolver and fake nodes (no processes, no HTTP): which nodes
it finds (static addresses, or discovery names resolved again before each step), the order of its steps,
a worker that joins mid-rollout caught up, one that leaves skipped, and the `current` link repointed only
once every node serves the new version. tests/integration/test_data_rollout.py runs it on real nodes."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests

from pipeline.config import Settings
from pipeline.config.parsers import Address
from tests.support.data_versions import manifest_only_version
from tools.data_rollout import Rollout, RolloutFailed, Topology
from tools.topology import COMPOSE_TOPOLOGY

pytestmark = pytest.mark.timeout(60)

# deploy/compose.yaml's wiring at two shards (node2, node3, the names the fake DNS below answers): the
# gateway by its name, the workers and each shard's replicas by theirs.
COMPOSE = COMPOSE_TOPOLOGY._replace(shards=2).wiring()


class Names:
    """A resolver over a table of names, changed by the test as DNS records would change."""

    def __init__(self, **names: list[str]):
        self.names = dict(names)
        self.fail = False

    def resolve(self, host: str) -> list[str]:
        if self.fail or host not in self.names:
            raise OSError(f"cannot resolve {host}")
        return sorted(self.names[host])


def urls(nodes) -> list[str]:
    return [node.url for node in nodes]


# ---------------------------------------------------------------- the topology it walks


def test_static_addresses_are_walked_as_the_settings_place_them():
    cluster = Settings.from_env({"TOTAL_NODES": "5", "INDEX_NODES": "3,4", "INDEX_SHARDS": "2"}).cluster
    topology = Topology(cluster, Names())  # nothing to resolve: a lookup would fail
    assert urls(topology.gateways()) == ["http://127.0.0.1:8000"]
    assert urls(topology.workers()) == [f"http://127.0.0.1:{8000 + n}" for n in (0, 1, 2)]
    assert urls(topology.index_nodes()) == ["http://127.0.0.1:8003", "http://127.0.0.1:8004"]
    node = topology.node(2)  # one node by number (a step given it alone)
    assert (node.name, node.url, node.listed()) == ("node 2", "http://127.0.0.1:8002", True)


def test_discovered_nodes_are_whoever_their_names_list_at_each_call():
    names = Names(worker=["10.0.0.5", "10.0.0.6"], node2=["10.0.0.2"], node3=["10.0.0.3", "10.0.0.4"])
    topology = Topology(Settings.from_env(COMPOSE).cluster, names)
    # Node 0 by its static name (a worker too); the `worker` service's containers, never NODE_1_IP itself.
    assert urls(topology.workers()) == ["http://node0:8000", "http://10.0.0.5:8000", "http://10.0.0.6:8000"]
    assert urls(topology.index_nodes()) == [f"http://10.0.0.{n}:8000" for n in (2, 3, 4)]
    names.names["worker"] = ["10.0.0.5", "10.0.0.6", "10.0.0.7"]  # scaled up
    names.names["node2"] = ["10.0.0.2", "10.0.0.8"]  # a replica of shard 0 added
    assert urls(topology.workers())[-1] == "http://10.0.0.7:8000"
    assert urls(topology.index_nodes()) == [f"http://10.0.0.{n}:8000" for n in (2, 8, 3, 4)]
    names.fail = True  # a DNS outage keeps the members last seen
    assert len(topology.workers()) == 4 and len(topology.index_nodes()) == 4


def test_every_gateway_a_name_lists_is_a_worker_too_and_an_unresolvable_name_fails_the_rollout():
    names = Names(**{"rag-gateway-pods": ["10.1.0.1", "10.1.0.2"], "worker": ["10.0.0.5"]})
    topology = Topology(Settings.from_env(COMPOSE).cluster, names, gateways=Address("rag-gateway-pods", 8000))
    assert urls(topology.gateways()) == ["http://10.1.0.1:8000", "http://10.1.0.2:8000"]
    assert urls(topology.workers()) == ["http://10.1.0.1:8000", "http://10.1.0.2:8000", "http://10.0.0.5:8000"]
    with pytest.raises(RolloutFailed, match="cannot resolve node2:8000"):
        topology.index_nodes()  # never resolved: its replicas cannot be rolled, so nothing is released


# ---------------------------------------------------------------- the walk, on fake nodes


class FakeNode:
    """A node's /data routes as services.roles.data_routes answers them, on versions `on_disk`."""

    def __init__(self, role: str, current: str = "v1", on_disk=("v1", "v2")):
        self.role, self.current, self.loaded, self.on_disk = role, current, [current], set(on_disk)
        self.up = True

    def handle(self, method: str, path: str, body: dict | None) -> tuple[int, dict]:
        status = {"current": self.current, "loaded": [{"version": v, "in_flight": 0} for v in self.loaded]}
        version = (body or {}).get("version")
        if (method, path) == ("GET", "/data") or path == "/cache/clear":
            return 200, status
        if path == "/data/load":
            if version not in self.on_disk:
                return 409, {"error": f"{version} holds no manifest.json"}
            self.loaded += [version] if version not in self.loaded else []
        elif path == "/data/switch":
            if version not in self.loaded:
                return 503, {"error": f"data version {version!r} is not loaded here; load it first"}
            self.current = version
        elif path == "/data/release":
            if version == self.current:
                return 409, {"error": f"data version {version!r} is the current one"}
            self.loaded.remove(version)
        return 200, {"current": self.current, "loaded": [{"version": v} for v in self.loaded]}


class FakeResponse:
    def __init__(self, status_code: int, body: dict):
        self.status_code, self.body, self.text = status_code, body, str(body)

    def json(self) -> dict:
        return self.body


class FakeCluster:
    """Nodes by URL behind a fake session; `calls` records (url, method, path, version) in order and
    `on_call` lets a test change the cluster at a given call (a worker joining mid-rollout)."""

    def __init__(self, names: Names, nodes: dict[str, FakeNode]):
        self.names, self.nodes = names, nodes
        self.calls: list[tuple[str, str, str, str | None]] = []
        self.on_call = lambda url, method, path: None

    def request(self, method: str, url: str, json=None, timeout=None) -> FakeResponse:
        base, path = url[:url.index("/", len("http://"))], url[url.index("/", len("http://")):]
        self.on_call(base, method, path)
        node = self.nodes.get(base)
        if node is None or not node.up:
            raise requests.ConnectionError(f"{base} is not answering")
        self.calls.append((base, method, path, (json or {}).get("version")))
        return FakeResponse(*node.handle(method, path, json))

    def close(self) -> None:
        pass

    def add(self, service: str, ip: str, role: str, current: str = "v1") -> None:
        self.names.names[service] = [*self.names.names[service], ip]
        self.nodes[f"http://{ip}:8000"] = FakeNode(role, current)

    def index(self, url: str, method: str, path: str) -> int:
        return next(i for i, call in enumerate(self.calls) if call[:3] == (url, method, path))


def compose_cluster() -> FakeCluster:
    names = Names(worker=["10.0.0.5", "10.0.0.6"], node2=["10.0.0.2"], node3=["10.0.0.3"])
    nodes = {"http://node0:8000": FakeNode("gateway"), "http://10.0.0.5:8000": FakeNode("worker"),
             "http://10.0.0.6:8000": FakeNode("worker"), "http://10.0.0.2:8000": FakeNode("index"),
             "http://10.0.0.3:8000": FakeNode("index")}
    return FakeCluster(names, nodes)


def rollout(cluster: FakeCluster, version: str = "v2", **kwargs) -> Rollout:
    walk = Rollout(Settings.from_env(COMPOSE), version, resolver=cluster.names, node_wait_s=2, **kwargs)
    walk.session = cluster  # type: ignore[assignment]
    return walk


def serve_alone(cluster: FakeCluster, version: str) -> None:
    for url, node in cluster.nodes.items():
        if node.up:
            assert (node.current, node.loaded) == (version, [version]), url


def test_every_index_node_holds_the_version_before_a_worker_switches_and_releases_come_last():
    cluster = compose_cluster()
    rollout(cluster).run()
    serve_alone(cluster, "v2")
    index_urls = [u for u, n in cluster.nodes.items() if n.role == "index"]
    worker_urls = [u for u, n in cluster.nodes.items() if n.role != "index"]
    first_switch = min(cluster.index(u, "POST", "/data/switch") for u in worker_urls)
    assert max(cluster.index(u, "POST", "/data/load") for u in index_urls) < first_switch
    assert max(cluster.index(u, "POST", "/data/load") for u in worker_urls) < first_switch
    # No worker releases the old version before every worker switched; the index nodes release last.
    last_worker_switch = max(cluster.index(u, "POST", "/data/switch") for u in worker_urls)
    assert min(cluster.index(u, "POST", "/data/release") for u in worker_urls) > last_worker_switch
    cleared = cluster.index("http://node0:8000", "POST", "/cache/clear")
    assert max(cluster.index(u, "POST", "/data/release") for u in worker_urls) < cleared
    assert min(cluster.index(u, "POST", "/data/switch") for u in index_urls) > cleared
    assert [c for c in cluster.calls if c[2] == "/cache/clear"] == [("http://node0:8000", "POST", "/cache/clear", None)]


@pytest.mark.parametrize("joins_at", ["/data/switch", "/data/release"])
def test_a_worker_that_joins_mid_rollout_on_the_old_version_is_brought_to_the_new_one(joins_at):
    cluster = compose_cluster()

    def join(url, method, path):  # the third worker container starts (on the old version) during that step
        if path == joins_at and "http://10.0.0.7:8000" not in cluster.nodes:
            cluster.add("worker", "10.0.0.7", "worker")
    cluster.on_call = join
    rollout(cluster).run()
    serve_alone(cluster, "v2")
    joined = [c[2:] for c in cluster.calls if c[0] == "http://10.0.0.7:8000" and c[1] == "POST"]
    assert joined[:2] == [("/data/load", "v2"), ("/data/switch", "v2")]
    assert ("/data/release", "v1") in joined


def test_an_index_replica_that_joins_after_the_index_step_is_caught_by_the_last_check():
    cluster = compose_cluster()

    def join(url, method, path):
        if path == "/data/release" and cluster.nodes[url].role == "index" and "http://10.0.0.8:8000" not in cluster.nodes:
            cluster.add("node2", "10.0.0.8", "index")
    cluster.on_call = join
    rollout(cluster).run()
    serve_alone(cluster, "v2")


def test_a_worker_that_leaves_mid_rollout_is_skipped():
    cluster = compose_cluster()

    def leave(url, method, path):  # scaled down: unlisted and gone as the workers switch
        if path == "/data/switch" and cluster.nodes["http://10.0.0.6:8000"].up:
            cluster.names.names["worker"] = ["10.0.0.5"]
            cluster.nodes["http://10.0.0.6:8000"].up = False
    cluster.on_call = leave
    rollout(cluster).run()
    serve_alone(cluster, "v2")


def test_a_node_that_refuses_the_version_fails_the_rollout_naming_it_before_any_worker_switches():
    cluster = compose_cluster()
    cluster.nodes["http://10.0.0.3:8000"].on_disk = {"v1"}  # v2 was never built on that machine
    with pytest.raises(RolloutFailed, match=r"node3 10\.0\.0\.3:8000 POST /data/load .* 409"):
        rollout(cluster).run()
    assert all(node.current == "v1" for node in cluster.nodes.values())


# ---------------------------------------------------------------- the `current` link


def test_the_link_is_repointed_once_every_node_serves_the_version(tmp_path: Path):
    manifest_only_version(tmp_path, "v1"), manifest_only_version(tmp_path, "v2")
    os.symlink("v1", tmp_path / "current")
    cluster, seen = compose_cluster(), []
    cluster.on_call = lambda url, method, path: seen.append((method, os.readlink(tmp_path / "current")))
    rollout(cluster, link=tmp_path / "current").run()
    assert os.readlink(tmp_path / "current") == "v2"
    assert {link for method, link in seen if method == "POST"} == {"v1"}  # every load, switch and release
    assert seen[-1] == ("GET", "v2")  # the last check, after it moved


def test_a_link_that_is_no_link_or_a_version_not_built_beside_it_is_refused_before_anything_runs(tmp_path: Path):
    manifest_only_version(tmp_path, "v1")
    os.symlink("v1", tmp_path / "current")
    cluster = compose_cluster()
    with pytest.raises(ValueError, match="not complete beside"):
        rollout(cluster, link=tmp_path / "current")
    with pytest.raises(ValueError, match="not a symbolic link"):
        rollout(cluster, "v1", link=tmp_path / "v1")
    assert cluster.calls == []
