"""A running cluster rolled over to a new data version under steady load (real processes on 127.0.0.1):
version 1 to version 2 (documents added, replaced and deleted), then version 2 to version 3 with an
index node and a worker SIGKILLed during the switch.

Every reply names the version that answered it; its `sources` must be exactly what that version's
search and fetch give for its query (computed here, in-process, from that version's files): a request
that searched one version and fetched from another would show it."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from builders.data import build_support
from builders.incremental import Changes, update_version
from builders.manifest import configured_embedder
from pipeline.config import REPO_ROOT
from pipeline.docstore import Document, DocumentStore
from pipeline.reranker import RerankRequest
from pipeline.spec import REFERENCE_QUERIES, TOP_K
from pipeline.vector_index import ShardedVectorIndex
from tests.helpers import health, start_cluster, uid, wait_until
from tools.data_rollout import Rollout
from tools.local import local_topology

pytestmark = pytest.mark.slow

DELETED = (5, 17, 42, 77)
REPLACED = {8: "Parcel lockers keep a delivered package for seven days before it goes back to the depot.",
            23: "Loyalty points expire after eighteen months without a purchase on the account."}
ADDED = {10_000: "Gift cards are redeemed at checkout by typing the sixteen digit code on the back.",
         10_001: "Drones deliver small parcels within two hours in selected city centres.",
         10_002: "Rental skis are returned at any store before closing time on the last rental day."}
V3_ADDED = {10_003: "Pet insurance claims are paid within ten days of the vet invoice."}
CLIENTS = 3


def documents(changes: dict[int, str], category: str = "general") -> tuple[Document, ...]:
    return tuple(Document(doc_id, f"Article {doc_id}", content, category) for doc_id, content in changes.items())


@pytest.fixture(scope="module")
def root(tmp_path_factory, embedder) -> Path:
    root = tmp_path_factory.mktemp("versions")
    identity = configured_embedder(768)  # the nodes' embedder: the tiny stand-in's, float32
    build_support(root / "v1", 300, embedder.embed, seed=0, shards=2, embedder=identity, progress=False)
    with DocumentStore(root / "v1" / "documents") as v1:  # the deleted documents' own text, asked about below
        deleted = {doc.doc_id: doc.content for doc in v1.fetch(DELETED)}
    assert sorted(deleted) == sorted(DELETED)
    update_version(root / "v1", root / "v2", Changes(documents({**REPLACED, **ADDED}), DELETED), embedder.embed,
                   identity)
    update_version(root / "v2", root / "v3", Changes(documents(V3_ADDED), (10_000,)), embedder.embed, identity)
    os.symlink("v1", root / "current")  # the nodes go through it: a switch repoints it
    (root / "deleted.txt").write_text("\n".join(deleted.values()))
    return root


def queries(root: Path) -> list[str]:
    return [*REFERENCE_QUERIES[:2], *REPLACED.values(), *ADDED.values(), *V3_ADDED.values(),
            *(root / "deleted.txt").read_text().splitlines()]


@pytest.fixture(scope="module")
def expected(root, embedder, reranker) -> dict[str, dict[str, set[int]]]:
    """version -> query -> the doc_ids its search, fetch and rerank give in that version, embedded on
    one torch thread as the nodes embed (TORCH_THREADS=1: the same sums in the same order)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _expected(root, embedder, reranker)
    finally:
        torch.set_num_threads(threads)


def _expected(root: Path, embedder, reranker) -> dict[str, dict[str, set[int]]]:
    table: dict[str, dict[str, set[int]]] = {}
    for version in ("v1", "v2", "v3"):
        directory = root / version
        index = ShardedVectorIndex.load([directory / f"faiss_index.shard-{k}-of-2.bin" for k in range(2)], nprobe=64)
        with DocumentStore(directory / "documents") as store:
            table[version] = {}
            for query in queries(root):
                ids, _ = index.search(embedder.embed([query]), TOP_K)
                found = store.fetch(ids[0].tolist())
                ranked = reranker.rerank([RerankRequest(query, tuple(found))])[0]
                table[version][query] = {scored.document.doc_id for scored in ranked}
    return table


@pytest.fixture(scope="module")
def cluster(root, tmp_path_factory):
    data = SimpleNamespace(index_path=root / "current" / "faiss_index.bin",
                           db_path=root / "current" / "documents" / "documents.db")
    cluster = start_cluster(data, tmp_path_factory.mktemp("rollout-logs"), **local_topology(2, 2, 1),
                            SHUTDOWN_GRACE_S="5")
    yield cluster
    cluster.stop()


@dataclass
class Reply:
    query: str
    started: float
    status: int
    body: dict


class SteadyLoad:
    """CLIENTS threads, each asking the queries in turn, one request at a time, until stopped."""

    def __init__(self, url: str, asked: list[str]):
        self.url, self.asked = url, asked
        self.replies: list[Reply] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)]

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def _client(self, first: int) -> None:
        turn = first
        while not self._stop.is_set():
            query = self.asked[turn % len(self.asked)]
            turn += CLIENTS
            started = time.monotonic()
            try:
                response = requests.post(f"{self.url}/query", json={"request_id": uid("roll"), "query": query},
                                         timeout=250)
                reply = Reply(query, started, response.status_code, response.json())
            except (requests.RequestException, ValueError) as exc:
                reply = Reply(query, started, 0, {"error": repr(exc)})
            with self._lock:
                self.replies.append(reply)

    def count(self, since: float = 0.0) -> int:
        with self._lock:
            return sum(reply.started >= since for reply in self.replies)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=300)


def roll(cluster, version: str, *options: str) -> subprocess.CompletedProcess:
    """What an operator types: `./run.sh data-rollout VERSION`, with the nodes' own environment."""
    env = {k: v for k, v in cluster.env.items() if k != "NODE_NUMBER"}
    return subprocess.run([sys.executable, "-m", "tools.data_rollout", version, *options], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=400)


def served(cluster, node: int) -> dict:
    return requests.get(f"{cluster.url(node)}/data", timeout=10).json()


def check_replies(replies: list[Reply], expected, versions: set[str]) -> dict[str, int]:
    """Every reply from one version: its sources are that version's for its query. Count per version."""
    counts: dict[str, int] = {}
    for reply in replies:
        version = reply.body["data_version"]
        assert version in versions, reply
        assert set(reply.body["sources"]) == expected[version][reply.query], (version, reply.query, reply.body)
        counts[version] = counts.get(version, 0) + 1
    return counts


def test_a_cluster_under_load_switches_versions_with_every_request_answered_from_one_version(cluster, root,
                                                                                           expected):
    assert {health(cluster, node)["data_version"] for node in cluster.start_order} == {"v1"}
    asked = queries(root)
    with SteadyLoad(cluster.url(0), asked) as load:
        wait_until(lambda: load.count() >= 2 * CLIENTS, 300, "replies from version 1")
        rolled = roll(cluster, "v2", "--link", str(root / "current"))
        assert rolled.returncode == 0, rolled.stderr[-3000:]
        switched = time.monotonic()
        wait_until(lambda: load.count(since=switched) >= len(asked), 400, "replies after the switch")
    assert [r for r in load.replies if r.status != 200] == []  # every request answered
    counts = check_replies(load.replies, expected, {"v1", "v2"})
    assert counts.get("v1") and counts.get("v2"), counts
    after = [reply for reply in load.replies if reply.started >= switched]
    assert {reply.body["data_version"] for reply in after} == {"v2"}
    v2_replies = [reply for reply in load.replies if reply.body["data_version"] == "v2"]
    returned = {doc_id for reply in v2_replies for doc_id in reply.body["sources"]}
    assert not returned & set(DELETED)  # deleted documents are never returned by version 2
    for doc_id, content in ADDED.items():  # and added ones are found by a question about them
        assert all(doc_id in reply.body["sources"] for reply in v2_replies if reply.query == content)
    assert set(ADDED) <= returned
    for node in cluster.start_order:  # every node serves version 2 alone; version 1 was released
        assert [entry["version"] for entry in served(cluster, node)["loaded"]] == ["v2"], node
        assert health(cluster, node)["data_version"] == "v2"
    assert os.readlink(root / "current") == "v2"  # a restarted node comes back on version 2


def test_a_switch_interrupted_by_killed_nodes_leaves_each_request_on_one_version_and_completes_when_run_again(
        cluster, root, expected):
    index_node, worker = cluster.settings.cluster.replicas(1)[0], 1
    rollout = Rollout(cluster.settings, "v3", release_timeout_s=30, node_wait_s=240)
    with SteadyLoad(cluster.url(0), queries(root)) as load:
        wait_until(lambda: load.count() >= CLIENTS, 300, "replies from version 2")
        rollout.step(rollout.topology.index_nodes, "load")
        cluster.kill_node(index_node)  # SIGKILL after it loaded version 3, before any worker switched
        cluster.start_node(index_node)
        cluster.wait_healthy([index_node], timeout_s=120)
        rollout.step([rollout.topology.node(worker)], "switch")  # loads, then switches; node 0 still on version 2
        mixed = time.monotonic()
        wait_until(lambda: load.count(since=mixed) >= CLIENTS, 300, "replies while the workers differ")
        cluster.kill_node(worker)  # SIGKILL in the middle of the switch
        cluster.start_node(worker)
        cluster.wait_healthy([worker], timeout_s=300)
        rolled = roll(cluster, "v3")  # the next attempt completes
        assert rolled.returncode == 0, rolled.stderr[-3000:]
        switched = time.monotonic()
        wait_until(lambda: load.count(since=switched) >= 2 * CLIENTS, 400, "replies after the switch")
    answered = [reply for reply in load.replies if reply.status == 200]
    # The killed worker's requests in flight are computed again on node 0 or refused with a clear 503.
    assert [reply for reply in load.replies if reply.status not in (200, 503)] == []
    counts = check_replies(answered, expected, {"v2", "v3"})
    assert counts.get("v3"), counts
    assert {reply.body["data_version"] for reply in answered if reply.started >= switched} == {"v3"}
    for node in cluster.start_order:
        assert [entry["version"] for entry in served(cluster, node)["loaded"]] == ["v3"], node
    assert os.readlink(root / "current") == "v3"
