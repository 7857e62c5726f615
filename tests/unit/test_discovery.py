"""Membership that changes at run time, with a fake resolver: names resolved again, a failed lookup
keeping the members, the gateway's router taking in a new worker only once it is ready, and a
worker that leaves routed nothing more while the forward it has answers (no models, no HTTP)."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pipeline.config import ConfigError, Settings
from pipeline.config.parsers import Address
from services.cluster.discovery import HostsFileResolver, Membership, resolver_for
from services.roles.gateway.routing import DiscoveredWorkers, Router, WorkerTarget
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

    def __init__(self, address: Address, ready: bool = True):
        self.address, self.ready = address, ready
        self.gate: threading.Event | None = None
        self.started = threading.Event()
        self.served: list[str] = []
        self.closed = 0

    def answer(self, request: AnswerRequest, deadline: Deadline):
        if not self.ready:
            raise PeerUnavailable(f"{self.address} is stopping")
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(10), "test gate never opened"
        self.served.append(request.request_id)
        yield FinalAnswer(request.request_id, str(self.address), "neutral", "false")

    def target(self) -> WorkerTarget:
        def close():
            self.closed += 1
        return WorkerTarget(node=str(self.address), answer=self.answer, probe=lambda: self.ready, close=close,
                            up=False)


def discovered(router: Router, workers: dict[Address, Worker], resolver: FakeResolver) -> Membership:
    def make(address: Address) -> WorkerTarget:
        workers.setdefault(address, Worker(address))
        return workers[address].target()
    return Membership(NAME, resolver, 3600, DiscoveredWorkers(router, make).on_change)


def local_router() -> tuple[Router, Worker]:
    local = Worker(Address("local", 0))
    target = local.target()
    target.up, target.local = True, True
    return Router([target]), local


def ask(router: Router, request_id: str) -> dict:
    return collect(router.forward(AnswerRequest(request_id, "where is my order?"), Deadline.after(10))).wire()


def test_a_membership_reports_each_change_of_its_names_addresses_at_its_port():
    resolver, changes = FakeResolver("10.0.0.2"), []
    membership = Membership(NAME, resolver, 3600, changes.append)
    assert membership.refresh() == [Address("10.0.0.2", 8000)]
    assert membership.refresh() == [Address("10.0.0.2", 8000)]  # unchanged: not reported again
    resolver.hosts = ["10.0.0.2", "10.0.0.3"]
    membership.refresh()
    resolver.hosts = []
    membership.refresh()
    assert changes == [[Address("10.0.0.2", 8000)], [Address("10.0.0.2", 8000), Address("10.0.0.3", 8000)], []]
    assert resolver.lookups == ["rag-worker"] * 4


def test_a_lookup_that_fails_keeps_the_members_last_seen():
    resolver, changes = FakeResolver("10.0.0.2", "10.0.0.3"), []
    membership = Membership(NAME, resolver, 3600, changes.append)
    membership.refresh()
    resolver.fail = True
    assert membership.refresh() == [Address("10.0.0.2", 8000), Address("10.0.0.3", 8000)]
    assert len(changes) == 1


def test_a_started_membership_resolves_again_every_interval_until_closed():
    resolver, changed = FakeResolver("10.0.0.2"), threading.Event()
    membership = Membership(NAME, resolver, 0.01, lambda members: changed.set() if len(members) == 2 else None)
    membership.start()
    assert membership.members == [Address("10.0.0.2", 8000)]  # the first lookup is done by start()
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
    resolver, workers = FakeResolver("10.0.0.2"), {Address("10.0.0.2", 8000): Worker(Address("10.0.0.2", 8000),
                                                                                       ready=False)}
    membership = discovered(router, workers, resolver)
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
    resolver, workers = FakeResolver(), {}
    membership = discovered(router, workers, resolver)
    membership.refresh()
    resolver.hosts = ["10.0.0.3"]
    membership.refresh()  # joins and is probed at once
    assert {ask(router, f"c{i}")["generated_response"] for i in range(4)} == {"local:0", "10.0.0.3:8000"}


def test_a_worker_that_leaves_is_routed_nothing_more_its_forward_in_flight_answers_then_it_closes():
    router, local = local_router()
    resolver, workers = FakeResolver("10.0.0.2"), {}
    membership = discovered(router, workers, resolver)
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
    resolver, workers = FakeResolver("10.0.0.2"), {}
    membership = discovered(router, workers, resolver)
    membership.refresh()
    resolver.hosts = []
    membership.refresh()
    assert workers[Address("10.0.0.2", 8000)].closed == 1
    resolver.hosts = ["10.0.0.2"]
    membership.refresh()
    assert [s["node"] for s in router.status() if s["up"]] == ["local:0", "10.0.0.2:8000"]


def test_a_stopping_worker_fails_over_to_another_and_leaves_the_rotation():
    router, local = local_router()
    resolver, workers = FakeResolver("10.0.0.2"), {}
    membership = discovered(router, workers, resolver)
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
    router, resolver, workers = Router([]), FakeResolver(), {}
    membership = discovered(router, workers, resolver)
    membership.refresh()
    with pytest.raises(NoWorkerAvailable, match="no worker is known yet"):
        ask(router, "g0")
    resolver.hosts = ["10.0.0.4"]
    membership.refresh()
    assert ask(router, "g1")["generated_response"] == "10.0.0.4:8000"
