"""A worker's sharded index client against small /search servers on 127.0.0.1: the merged top k
equals the unsharded search, replicas fail over, and a shard that stays down fails the search by
name (never a partial answer)."""
from __future__ import annotations

import contextlib
import json
import time
from http.server import BaseHTTPRequestHandler

import faiss
import numpy as np
import pytest

from pipeline.config import Settings
from pipeline.shards import document_shard
from services.cluster.clients import IndexClient
from services.cluster.sharded_index import ShardedIndexClient
from services.server.errors import DeadlineExceeded, ShardUnavailable
from tests.fake_node import LocalServer
from tools.local import free_ports

pytestmark = pytest.mark.timeout(60)

DIM, DOCS, K = 16, 300, 10


class SearchServer(LocalServer):
    """/search over a flat index of the given ids' vectors; `status` other than 200 answers that;
    `delay_s` answers late."""

    def __init__(self, vectors: np.ndarray, ids: np.ndarray):
        index = faiss.IndexIDMap(faiss.IndexFlatL2(DIM))
        index.add_with_ids(vectors[ids], ids.astype(np.int64))
        self.index, self.status, self.delay_s, self.calls = index, 200, 0.0, 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.calls += 1
                time.sleep(server.delay_s)
                if server.status != 200:
                    payload = {"error": "index node stopping"}
                else:
                    distances, found = server.index.search(np.asarray(body["embeddings"], dtype=np.float32), body["k"])
                    payload = {"ids": found.tolist(), "distances": distances.tolist()}
                data = json.dumps(payload).encode()
                self.send_response(server.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except BrokenPipeError:  # the client gave up at its deadline (the slow-shard test)
                    pass

        super().__init__(Handler)


@pytest.fixture
def corpus():
    rng = np.random.default_rng(0)
    return rng.standard_normal((DOCS, DIM)).astype(np.float32), rng.standard_normal((6, DIM)).astype(np.float32)


@pytest.fixture
def servers(corpus):
    """Two shards (ids by document_shard), shard 0 with two replicas."""
    vectors, _ = corpus
    ids = np.arange(DOCS)
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(SearchServer(vectors, ids[document_shard(ids, 2) == shard]))
               for name, shard in (("shard0", 0), ("shard0-replica", 0), ("shard1", 1))}


def client(shards: list[list[str]], **kwargs) -> ShardedIndexClient:
    return ShardedIndexClient([IndexClient(urls, connect_timeout_s=1, read_timeout_s=5, backoff_s=0.05,
                                           max_backoff_s=0.1, name=f"index shard {k} of {len(shards)}", **kwargs)
                               for k, urls in enumerate(shards)])


def test_the_merged_top_k_of_two_shards_equals_the_unsharded_search(corpus, servers):
    vectors, queries = corpus
    whole = faiss.IndexFlatL2(DIM)
    whole.add(vectors)
    expected_distances, expected_ids = whole.search(queries, K)
    index = client([[servers["shard0"].url], [servers["shard1"].url]])
    ids, distances = index.search(queries, K, deadline=time.monotonic() + 10)
    assert ids == expected_ids.tolist()
    np.testing.assert_allclose(distances, expected_distances, rtol=1e-6)
    index.close()


def test_searches_take_turns_over_a_shards_replicas_and_skip_one_that_is_down(corpus, servers):
    _, queries = corpus
    a, b = servers["shard0"], servers["shard0-replica"]
    index = client([[a.url, b.url], [servers["shard1"].url]])
    first = index.search(queries, K, deadline=time.monotonic() + 10)
    for _ in range(3):
        assert index.search(queries, K, deadline=time.monotonic() + 10) == first
    assert a.calls == b.calls == 2  # turns: each replica took half
    b.status = 503  # stopping: the other replica answers, at once
    for _ in range(4):
        assert index.search(queries, K, deadline=time.monotonic() + 10) == first
    assert a.calls == 6
    (closed,) = free_ports(1)  # nothing listens there: refused
    index = client([[f"http://127.0.0.1:{closed}", a.url], [servers["shard1"].url]])
    assert [index.search(queries, K, deadline=time.monotonic() + 10) for _ in range(3)] == [first] * 3
    index.close()


def test_a_shard_with_every_replica_down_fails_the_search_naming_it_at_the_deadline(corpus, servers):
    _, queries = corpus
    (closed,) = free_ports(1)
    servers["shard0"].status = 503
    index = client([[servers["shard1"].url], [servers["shard0"].url, f"http://127.0.0.1:{closed}"]])
    started = time.monotonic()
    with pytest.raises(ShardUnavailable, match="index shard 1 of 2 is unavailable"):
        index.search(queries, K, deadline=started + 1.0)
    assert time.monotonic() - started < 3.0
    index.close()


def test_a_shard_that_is_only_slow_times_out_rather_than_being_called_down(corpus, servers):
    _, queries = corpus
    servers["shard1"].delay_s = 2.0
    index = client([[servers["shard0"].url], [servers["shard1"].url]])
    with pytest.raises(DeadlineExceeded):
        index.search(queries, K, deadline=time.monotonic() + 0.5)
    index.close()


def test_the_cluster_section_places_each_shards_replicas():
    cluster = Settings.from_env({"TOTAL_NODES": "6", "INDEX_NODES": "3,4,5", "INDEX_SHARDS": "2",
                                 "NODE_3_IP": "10.0.0.3:9000"}).cluster
    index = ShardedIndexClient.from_cluster(cluster, read_timeout_s=5)
    assert [shard.base_urls for shard in index.shards] == [["http://10.0.0.3:9000", "http://127.0.0.1:8005"],
                                                          ["http://127.0.0.1:8004"]]
    assert [shard.name for shard in index.shards] == ["index shard 0 of 2", "index shard 1 of 2"]
    index.close()


class Resolver:
    """A fake resolver: each name's hosts as the test sets them."""

    def __init__(self, **hosts: list[str]):
        self.hosts = hosts

    def resolve(self, host: str) -> list[str]:
        return list(self.hosts[host.replace("-", "_")])


def test_discovered_replicas_are_searched_as_their_names_list_them_now(corpus, servers):
    _, queries = corpus
    port = int(servers["shard0"].url.rsplit(":", 1)[1])
    replica_port = int(servers["shard0-replica"].url.rsplit(":", 1)[1])
    shard1_port = int(servers["shard1"].url.rsplit(":", 1)[1])
    assert port != replica_port  # one name, one port: the replica is reached as another name's member
    cluster = Settings.from_env({"TOTAL_NODES": "5", "INDEX_NODES": "2,3", "INDEX_SHARDS": "2",
                                 "INDEX_DISCOVERY": f"shard-0:{port},shard-1:{shard1_port}",
                                 "DISCOVERY_INTERVAL_S": "3600"}).cluster
    resolver = Resolver(shard_0=[], shard_1=["127.0.0.1"])
    index = ShardedIndexClient.from_cluster(cluster, read_timeout_s=5, resolver=resolver)
    with pytest.raises(ShardUnavailable, match="index shard 0 of 2 is unavailable.*no replica known"):
        index.search(queries, K, deadline=time.monotonic() + 0.5)  # none known yet: never a partial answer
    resolver.hosts["shard_0"] = ["127.0.0.1"]
    index.memberships[0].refresh()
    assert index.shards[0].base_urls == [servers["shard0"].url]
    ids, _ = index.search(queries, K, deadline=time.monotonic() + 10)
    assert servers["shard0"].calls == 1 and servers["shard0-replica"].calls == 0 and len(ids[0]) == K
    index.close()
