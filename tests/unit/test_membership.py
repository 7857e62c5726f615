"""One membership per role, from either source: the static NODE_<n>_IP list and a DNS name (a fake
resolver given by constructor) resolved again, a failed lookup keeping the members; the gateway's
router keeping its workers equal to a membership (a new worker taking requests only once ready, one
that leaves routed nothing more while its forward answers) and a sharded index its replicas (no
models, no HTTP)."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pipeline.config import ConfigError, Settings
from pipeline.config.parsers import Address
from services.cluster.discovery import HostsFileResolver, resolver_for
from services.cluster.membership import (
    DnsSource,
    Joined,
    Member,
    Membership,
    StaticSource,
    all_workers,
    gateway_workers,
    shard_replicas,
)
from services.cluster.sharded_index import ShardedIndexClient
from services.roles.gateway.routing import MemberTargets, Router, WorkerTarget
from services.server.answer import FinalAnswer
from services.server.answer_request import AnswerRequest
from services.server.deadline import Deadline
from services.server.errors import PeerUnavailable
from services.server.stream_response import collect

pytestmark = pytest.mark.timeout(30)

NAME = Address("rag-worker", 8000)


class FakeResolver:
    """Answers what `hosts` holds now; `fail` makes the next lookups raise as a DNS outage would."""

    def __init__(self, *hosts: str):
        self.hosts = list(hosts)
        self.fail = False
        self.lookups: list[str] = []

    def resolve(self, host: str) -> list[str]:
        self.lookups.append(host)
        if self.fail:
            raise OSError("Temporary failure in name resolution")
        return list(self.hosts)


class Worker:
    """A fake worker target: ready or not, each answer optionally held on a gate, closed once."""

    def __init__(self, member: Member, ready: bool = True):
        self.member, self.ready = member, ready
        self.gate: threading.Event | None = None
        self.started = threading.Event()
        self.served: list[str] = []
        self.closed = 0

    def answer(self, request: AnswerRequest, deadline: Deadline):
        if not self.ready:
            raise PeerUnavailable(f"{self.member} is stopping")
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(10), "test gate never opened"
        self.served.append(request.request_id)
        yield FinalAnswer(request.request_id, str(self.member.address), "neutral", "false")

    def target(self) -> WorkerTarget:
        def close():
            self.closed += 1
        return WorkerTarget(node=self.member.name, answer=self.answer, probe=lambda: self.ready, close=close,
                            up=False)


def dns(*hosts: str) -> tuple[DnsSource, FakeResolver]:
    resolver = FakeResolver(*hosts)
    return DnsSource(NAME, resolver), resolver


def member(host: str, port: int = 8000) -> Member:
    return Member(f"{host}:{port}", Address(host, port))


def routed(router: Router, workers: dict[Address, Worker], source) -> Membership:
    """A membership of `source` whose members the router routes to (each a fake Worker)."""
    def make(m: Member) -> WorkerTarget:
        workers.setdefault(m.address, Worker(m))
        return workers[m.address].target()
    return Membership(source, 3600).subscribe(MemberTargets(router, make).on_change)


def local_router() -> tuple[Router, Worker]:
    local = Worker(Member("local:0", Address("local", 0)))
    target = local.target()
    target.up, target.local = True, True
    return Router([target]), local


def ask(router: Router, request_id: str) -> dict:
    return collect(router.forward(AnswerRequest(request_id, "where is my order?"), Deadline.after(10))).wire()


# ---------------------------------------------------------------- the membership and its sources


def test_a_static_list_is_its_nodes_named_by_number_and_needs_no_refresh_thread():
    source = StaticSource({0: Address("10.0.0.1", 8000), 1: Address("10.0.0.2", 8000)})
    changes: list[list[Member]] = []
    membership = Membership(source, 0.01).subscribe(changes.append).start()
    assert membership._thread is None  # nothing to read again
    assert membership.members == [Member(0, Address("10.0.0.1", 8000)), Member(1, Address("10.0.0.2", 8000))]
    membership.refresh()
    assert len(changes) == 1 and str(changes[0][1]) == "node 1" and changes[0][1].url == "http://10.0.0.2:8000"


def test_a_membership_reports_each_change_of_its_names_addresses_at_its_port():
    source, resolver = dns("10.0.0.2")
    changes: list[list[Member]] = []
    membership = Membership(source, 3600).subscribe(changes.append)
    assert membership.refresh() == [member("10.0.0.2")]
    assert membership.refresh() == [member("10.0.0.2")]  # unchanged: not reported again
    resolver.hosts = ["10.0.0.2", "10.0.0.3"]
    membership.refresh()
    resolver.hosts = []
    membership.refresh()
    assert changes == [[member("10.0.0.2")], [member("10.0.0.2"), member("10.0.0.3")], []]
    assert resolver.lookups == ["rag-worker"] * 4
    assert str(changes[0][0]) == "10.0.0.2:8000"  # a discovered member is named by its address


def test_a_lookup_that_fails_keeps_the_members_last_seen():
    source, resolver = dns("10.0.0.2", "10.0.0.3")
    changes: list[list[Member]] = []
    membership = Membership(source, 3600).subscribe(changes.append)
    membership.refresh()
    resolver.fail = True
    assert membership.refresh() == [member("10.0.0.2"), member("10.0.0.3")]
    assert len(changes) == 1


def test_a_lookup_that_fails_before_any_succeeded_leaves_the_members_unknown():
    source, resolver = dns("10.0.0.2")
    resolver.fail = True
    membership = Membership(source, 3600)
    assert membership.refresh() is None and membership.members is None


def test_a_subscriber_is_told_the_members_already_known():
    membership = Membership(dns("10.0.0.2")[0], 3600)
    membership.refresh()
    told: list[list[Member]] = []
    membership.subscribe(told.append)
    assert told == [[member("10.0.0.2")]]


def test_a_started_membership_resolves_again_every_interval_until_closed():
    (source, resolver), changed = dns("10.0.0.2"), threading.Event()
    membership = Membership(source, 0.01).subscribe(lambda members: changed.set() if len(members) == 2 else None)
    membership.start()
    assert membership.members == [member("10.0.0.2")]  # the first lookup is done by start()
    resolver.hosts = ["10.0.0.2", "10.0.0.9"]
    assert changed.wait(5), "the change was never picked up"
    membership.close()


def test_a_hosts_file_is_read_at_every_lookup(tmp_path: Path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2 rag-worker other  # a comment\n127.0.0.3 rag-worker\n# 127.0.0.4 rag-worker\n")
    resolver = HostsFileResolver(hosts)
    assert resolver.resolve("rag-worker") == ["127.0.0.2", "127.0.0.3"]
    hosts.write_text("127.0.0.3 rag-worker\n")
    assert resolver.resolve("rag-worker") == ["127.0.0.3"]
    with pytest.raises(OSError, match="rag-index"):
        resolver.resolve("rag-index")


def test_production_resolves_through_dns_unless_a_hosts_file_is_named(tmp_path: Path):
    assert type(resolver_for(Settings.from_env({}).cluster)).__name__ == "DnsResolver"
    cluster = Settings.from_env({"DISCOVERY_HOSTS_FILE": str(tmp_path / "hosts")}).cluster
    assert isinstance(resolver_for(cluster), HostsFileResolver)


def test_a_new_worker_gets_requests_only_once_its_probe_finds_it_ready():
    router, local = local_router()
    workers = {Address("10.0.0.2", 8000): Worker(member("10.0.0.2"), ready=False)}
    source, _ = dns("10.0.0.2")
    membership = routed(router, workers, source)
    membership.refresh()
    new = workers[Address("10.0.0.2", 8000)]
    assert [ask(router, f"a{i}")["generated_response"] for i in range(4)] == ["local:0"] * 4
    new.ready = True
    router.probe_once()
    answered = {ask(router, f"b{i}")["generated_response"] for i in range(4)}
    assert answered == {"local:0", "10.0.0.2:8000"}
    assert [s["node"] for s in router.status()] == ["local:0", "10.0.0.2:8000"]


def test_a_worker_that_joins_ready_is_routed_to_without_waiting_for_the_probe_interval():
    router, _ = local_router()
    source, resolver = dns()
    workers: dict[Address, Worker] = {}
    membership = routed(router, workers, source)
    membership.refresh()
    resolver.hosts = ["10.0.0.3"]
    membership.refresh()  # joins and is probed at once
    assert {ask(router, f"c{i}")["generated_response"] for i in range(4)} == {"local:0", "10.0.0.3:8000"}


def test_a_worker_that_leaves_is_routed_nothing_more_its_forward_in_flight_answers_then_it_closes():
    router, local = local_router()
    source, resolver = dns("10.0.0.2")
    workers: dict[Address, Worker] = {}
    membership = routed(router, workers, source)
    membership.refresh()
    leaving = workers[Address("10.0.0.2", 8000)]
    leaving.gate = threading.Event()
    replies: list[dict] = []
    # Round robin: one of the first two requests goes to the remote worker and waits on its gate.
    threads = [threading.Thread(target=lambda i=i: replies.append(ask(router, f"d{i}"))) for i in range(2)]
    for thread in threads:
        thread.start()
    assert leaving.started.wait(5)
    resolver.hosts = []
    membership.refresh()
    assert leaving.closed == 0  # its forward is still in flight
    assert [ask(router, f"e{i}")["generated_response"] for i in range(3)] == ["local:0"] * 3
    leaving.gate.set()
    for thread in threads:
        thread.join(5)
    assert sorted(r["generated_response"] for r in replies) == ["10.0.0.2:8000", "local:0"]
    assert leaving.closed == 1
    assert [s["node"] for s in router.status()] == ["local:0"]


def test_an_idle_worker_that_leaves_closes_at_once_and_a_returning_address_is_a_new_worker():
    router, _ = local_router()
    source, resolver = dns("10.0.0.2")
    workers: dict[Address, Worker] = {}
    membership = routed(router, workers, source)
    membership.refresh()
    resolver.hosts = []
    membership.refresh()
    assert workers[Address("10.0.0.2", 8000)].closed == 1
    resolver.hosts = ["10.0.0.2"]
    membership.refresh()
    assert [s["node"] for s in router.status() if s["up"]] == ["local:0", "10.0.0.2:8000"]


def test_a_stopping_worker_fails_over_to_another_and_leaves_the_rotation():
    router, local = local_router()
    source, _ = dns("10.0.0.2")
    workers: dict[Address, Worker] = {}
    membership = routed(router, workers, source)
    membership.refresh()
    workers[Address("10.0.0.2", 8000)].ready = False  # SIGTERM: it refuses new work with 503
    assert [ask(router, f"f{i}")["generated_response"] for i in range(4)] == ["local:0"] * 4
    assert [s["up"] for s in router.status()] == [True, False]


def test_index_discovery_names_one_name_per_shard():
    with pytest.raises(ConfigError, match="INDEX_DISCOVERY=.*one name per shard, 2"):
        Settings.from_env({"TOTAL_NODES": "5", "INDEX_NODES": "2,3", "INDEX_SHARDS": "2",
                           "INDEX_DISCOVERY": "rag-index-shard-0:8000"})
    cluster = Settings.from_env({"WORKER_DISCOVERY": "rag-worker:8000", "DISCOVERY_INTERVAL_S": "2"}).cluster
    assert cluster.worker_discovery == NAME and cluster.discovery_interval_s == 2


def test_a_gateway_without_workers_yet_answers_503_until_one_is_discovered():
    from services.server.errors import NoWorkerAvailable
    router, (source, resolver) = Router([]), dns()
    workers: dict[Address, Worker] = {}
    membership = routed(router, workers, source)
    membership.refresh()
    with pytest.raises(NoWorkerAvailable, match="no worker is known yet"):
        ask(router, "g0")
    resolver.hosts = ["10.0.0.4"]
    membership.refresh()
    assert ask(router, "g1")["generated_response"] == "10.0.0.4:8000"


def test_a_static_list_routes_as_a_name_does_its_remote_nodes_out_until_ready_and_named_by_number():
    router, local = local_router()
    workers: dict[Address, Worker] = {}
    routed(router, workers, StaticSource({1: Address("10.0.0.2", 8000), 3: Address("10.0.0.4", 8000)})).start()
    assert [(s["node"], s["up"]) for s in router.status()] == [("local:0", True), (1, True), (3, True)]
    workers[Address("10.0.0.4", 8000)].ready = False
    router.probe_once()
    answered = {ask(router, f"s{i}")["generated_response"] for i in range(6)}
    assert answered == {"local:0", "10.0.0.2:8000"}


# ---------------------------------------------------------------- each role's membership, from the settings


def test_the_gateway_routes_over_the_rotation_or_its_own_worker_beside_whoever_the_name_lists():
    static = Settings.from_env({"TOTAL_NODES": "5", "INDEX_NODES": "2", "WORKER_NODES": "0,3",
                                "NODE_3_IP": "10.0.0.3:9000"}).cluster
    assert gateway_workers(static).start().members == [Member(0, Address("127.0.0.1", 8000)),
                                                       Member(3, Address("10.0.0.3", 9000))]
    discovered = Settings.from_env({"WORKER_DISCOVERY": "rag-worker:8000"}).cluster
    resolver = FakeResolver("10.0.0.5", "10.0.0.6")
    membership = gateway_workers(discovered, 0, resolver)
    assert isinstance(membership.source, Joined)
    assert membership.refresh() == [Member(0, Address("127.0.0.1", 8000)), member("10.0.0.5"), member("10.0.0.6")]
    # Without node 0 in the rotation, the gateway routes to the discovered workers alone.
    remote_only = Settings.from_env({"WORKER_DISCOVERY": "rag-worker:8000", "WORKER_NODES": "1"}).cluster
    assert gateway_workers(remote_only, 0, resolver).refresh() == [member("10.0.0.5"), member("10.0.0.6")]
    resolver.fail = True  # the whole membership is kept, the static part with it
    assert membership.refresh() == [Member(0, Address("127.0.0.1", 8000)), member("10.0.0.5"), member("10.0.0.6")]


def test_every_worker_but_node_0_is_the_static_workers_or_the_name():
    cluster = Settings.from_env({"TOTAL_NODES": "5", "INDEX_NODES": "2", "WORKER_NODES": "0,3"}).cluster
    assert [m.name for m in all_workers(cluster).refresh() or []] == [1, 3, 4]  # rotation or not
    cluster = Settings.from_env({"WORKER_DISCOVERY": "rag-worker:8000"}).cluster
    assert all_workers(cluster, FakeResolver("10.0.0.5")).refresh() == [member("10.0.0.5")]


def test_each_shards_replicas_are_its_index_nodes_or_whoever_its_name_lists():
    cluster = Settings.from_env({"TOTAL_NODES": "6", "INDEX_NODES": "3,4,5", "INDEX_SHARDS": "2"}).cluster
    assert [[m.name for m in s.refresh() or []] for s in shard_replicas(cluster)] == [[3, 5], [4]]
    cluster = Settings.from_env({"TOTAL_NODES": "5", "INDEX_NODES": "2,3", "INDEX_SHARDS": "2",
                                 "INDEX_DISCOVERY": "shard-0:8000,shard-1:8000"}).cluster
    resolver = FakeResolver("10.0.0.7")
    shards = shard_replicas(cluster, resolver)
    assert [s.refresh() for s in shards] == [[member("10.0.0.7")]] * 2
    assert resolver.lookups == ["shard-0", "shard-1"]


def test_a_sharded_index_follows_its_shards_memberships():
    cluster = Settings.from_env({"TOTAL_NODES": "4", "INDEX_NODES": "2,3", "INDEX_SHARDS": "1",
                                 "INDEX_DISCOVERY": "rag-index:8000", "DISCOVERY_INTERVAL_S": "3600"}).cluster
    resolver = FakeResolver("10.0.0.8")
    index = ShardedIndexClient.from_cluster(cluster, read_timeout_s=5, resolver=resolver)
    try:
        assert index.shards[0].base_urls == ["http://10.0.0.8:8000"]
        resolver.hosts = ["10.0.0.8", "10.0.0.9"]
        index.memberships[0].refresh()
        assert index.shards[0].base_urls == ["http://10.0.0.8:8000", "http://10.0.0.9:8000"]
    finally:
        index.close()
