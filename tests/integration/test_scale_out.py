"""Beyond three nodes, as real processes on 127.0.0.1: three workers and an index in two shards,
one of them with two replicas, checked against the single-process reference over the unsharded
index; a worker and a replica killed under load lose no request."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline import spec
from tests.helpers import health, post_query, start_cluster
from tests.support.second_gateway import second_gateway
from tools.local import local_topology

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# Workers 0, 1, 2; index nodes 3 (shard 0), 4 (shard 1), 5 (shard 0 again: a replica of it).
TOPOLOGY = {**local_topology(workers=3, shards=2, replicas=1), "TOTAL_NODES": "6", "INDEX_NODES": "3,4,5"}
# A shard that stays down is given up on at the request's deadline: the shard-down test asks a gateway
# of its own with this one, the module's gateway keeps a deadline its loaded tests fit in.
SHARD_DOWN_TIMEOUT_S = 6


@pytest.fixture(scope="module")
def sharded_support(tmp_path_factory, embedder):
    """The support corpus of the `reference` fixture (same documents, seed and quantizer training),
    its index written as two shards."""
    from builders.data import build_support
    return build_support(tmp_path_factory.mktemp("support-sharded"), 400, embedder.embed, seed=0,
                         progress=False, shards=2)


@pytest.fixture(scope="module")
def cluster(sharded_support, tmp_path_factory):
    cluster = start_cluster(sharded_support, tmp_path_factory.mktemp("scale-out-logs"), **TOPOLOGY,
                            RERANK_MAX_WAIT_MS="20", SEARCH_MAX_WAIT_MS="20",
                            REQUEST_TIMEOUT_S="45", SHUTDOWN_GRACE_S="10")
    yield cluster
    cluster.stop()


def test_each_node_has_the_role_and_shard_its_settings_give(cluster):
    roles = {n: health(cluster, n)["role"] for n in range(6)}
    assert roles == {0: "gateway+worker", 1: "worker", 2: "worker", 3: "index", 4: "index", 5: "index"}
    assert [(health(cluster, n)["shard"], health(cluster, n)["shards"]) for n in (3, 4, 5)] == [(0, 2), (1, 2), (0, 2)]
    gateway = health(cluster, 0)
    assert sorted(w["node"] for w in gateway["workers"]) == [0, 1, 2]
    assert {p["node"]: p["role"] for p in gateway["peers"]} == {1: "worker", 2: "worker", 3: "index", 4: "index",
                                                               5: "index"}


def test_concurrent_answers_equal_the_unsharded_reference_and_every_worker_serves(cluster, reference_answer):
    url, queries = cluster.url(0), list(spec.REFERENCE_QUERIES) * 2
    with ThreadPoolExecutor(len(queries)) as pool:
        replies = list(pool.map(lambda iq: post_query(url, f"so-{iq[0]}", iq[1]), enumerate(queries)))
    served = set()
    for i, (query, response) in enumerate(zip(queries, replies)):
        assert response.status_code == 200, response.text
        reply = response.json()
        assert spec.validate_reply(reply, f"so-{i}") == []
        expected = reference_answer(query, f"so-{i}")
        assert {k: reply[k] for k in expected} == expected, f"query {query!r} differs from the reference"
        served.add(reply["served_by"])
    assert served == {0, 1, 2}


def test_a_worker_and_a_replica_killed_under_load_lose_no_request(cluster, reference_answer):
    url, results = cluster.url(0), {}
    queries = [spec.REFERENCE_QUERIES[i % 8] for i in range(18)]

    def send(i: int) -> None:
        results[i] = post_query(url, f"kill-{time.time_ns()}-{i}", queries[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(queries))]
    for i, thread in enumerate(threads):
        thread.start()
        if i == 6:
            cluster.kill_node(2)  # a worker, with requests of its own in flight
            cluster.kill_node(5)  # one replica of shard 0: node 3 still serves it
    for thread in threads:
        thread.join(timeout=600)
    assert sorted(results) == list(range(len(queries)))
    assert [results[i].status_code for i in range(len(queries))] == [200] * len(queries), \
        [results[i].text[:200] for i in range(len(queries)) if results[i].status_code != 200]
    for i, response in results.items():
        expected = reference_answer(queries[i])
        assert response.json()["generated_response"] == expected["generated_response"]
    cluster.start_node(5)
    cluster.start_node(2)
    cluster.wait_healthy(nodes=(5, 2), timeout_s=240)


def test_a_shard_with_every_replica_down_answers_503_naming_it_and_the_cluster_recovers(cluster, tmp_path):
    with second_gateway(cluster, tmp_path / "logs", REQUEST_TIMEOUT_S=str(SHARD_DOWN_TIMEOUT_S),
                        SHUTDOWN_GRACE_S=str(SHARD_DOWN_TIMEOUT_S / 2)) as gateway:
        cluster.kill_node(4)  # shard 1's only node
        try:
            response = post_query(gateway, f"down-{time.time_ns()}", "Where is my parcel?", timeout=120)
            assert response.status_code == 503, response.text[:300]
            assert "index shard 1 of 2 is unavailable" in response.json()["error"]
            assert int(response.headers["Retry-After"]) >= 1
            assert all(w["up"] for w in health(gateway, 0)["workers"])  # a shard down takes no worker out
        finally:
            cluster.start_node(4)
            cluster.wait_healthy(nodes=(4,), timeout_s=240)
    assert post_query(cluster.url(0), f"back-{time.time_ns()}", "Where is my parcel?").status_code == 200


def test_each_index_node_shows_the_recall_its_shard_was_built_with(cluster, sharded_support):
    recall = sharded_support.manifest.index["recall"]
    assert [health(cluster, n)["recall_at_10"] for n in (3, 4, 5)] == [recall["shards"][s] for s in (0, 1, 0)]
    assert {health(cluster, n)["recall_at_10_overall"] for n in (3, 4, 5)} == {recall["overall"]}
