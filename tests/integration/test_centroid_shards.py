"""Centroid shards served by real index node processes on 127.0.0.1: a worker's sharded client routes
each query to the shards owning its lists and gets the unsharded top 10; a query whose lists lie in
one shard is answered with another shard down; a replica killed is failed over; a body's bad "lists"
is a 400 naming the field."""
from __future__ import annotations

import shutil
import time

import faiss
import numpy as np
import pytest
import requests

from builders.centroid_shards import split_version
from builders.data import build_course
from builders.recall import RecallOptions
from pipeline.config import Settings
from pipeline.data_version import read_manifest
from services.cluster.sharded_index import CentroidRouters, ShardedIndexClient
from services.server.errors import ShardUnavailable
from tests.helpers import cluster_env
from tests.support import forked_nodes
from tools.local import LocalCluster

# Uniform course vectors are under the recall floor at a small nprobe; what is tested here is
# equality with the unsharded index at the same nprobe, not recall.
LOW_RECALL_ACCEPTED = RecallOptions(accept_low=True)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DOCS, DIM, NLIST, NPROBE = 3000, 32, 48, 6
# Nodes 1 and 3 serve shard 0 (INDEX_NODES positions 0 and 2), node 2 shard 1; node 0 is never started.
TOPOLOGY = {"TOTAL_NODES": "4", "INDEX_NODES": "1,2,3", "INDEX_SHARDS": "2", "NPROBE": str(NPROBE)}


@pytest.fixture(scope="module")
def version(tmp_path_factory):
    root = tmp_path_factory.mktemp("centroid-served")
    result = build_course(root / "v1", DOCS, nlist=NLIST, nprobe=NPROBE, dim=DIM, progress=False, batch_size=1000,
                          recall=LOW_RECALL_ACCEPTED)
    whole = faiss.read_index(str(shutil.copy(result.index_path, root / "whole.bin")))
    split_version(root / "v1", 2)
    return result, whole


@pytest.fixture(scope="module")
def cluster(version, tmp_path_factory):
    cluster = LocalCluster(cluster_env(version[0], **TOPOLOGY, SEARCH_TIMEOUT_S="5"),
                           tmp_path_factory.mktemp("centroid-logs"), launcher=forked_nodes.launch)
    try:
        for node in (1, 2, 3):
            cluster.start_node(node)
        cluster.wait_healthy(nodes=(1, 2, 3), timeout_s=120)
        yield cluster
    finally:
        cluster.stop()


def sharded_client(cluster, result) -> ShardedIndexClient:
    settings = Settings.from_env(cluster.env)
    routers = CentroidRouters(settings.fetch.documents_dir, settings.index.faiss_index_path.name, NPROBE)
    return ShardedIndexClient.from_cluster(settings.cluster, read_timeout_s=5, routers=routers)


def queries(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((n, DIM), dtype=np.float32)


def test_routed_searches_equal_the_unsharded_top_10(cluster, version):
    result, whole = version
    client = sharded_client(cluster, result)
    try:
        vectors = queries(40, 1)
        expected_distances, expected_ids = whole.search(vectors, 10)
        for version_name in (None, "v1"):
            ids, distances = client.search(vectors, 10, version=version_name)
            np.testing.assert_array_equal(np.array(ids), expected_ids)
            np.testing.assert_array_equal(np.array(distances, dtype=np.float32), expected_distances)
    finally:
        client.close()
    health = requests.get(f"{cluster.url(2)}/health", timeout=5).json()
    assert (health["shard"], health["shards"], health["sharding"]) == (1, 2, "centroid")


def test_bad_lists_are_a_400_naming_the_field(cluster, version):
    owners = read_manifest(version[0].index_path.parent).sharding["owners"]
    mine, other = owners.index(0), owners.index(1)
    vector = queries(1, 2).tolist()
    for lists, message in ((None, "'lists' is required"), ([[NLIST]], f"integers from 0 to {NLIST - 1}"),
                           ([[other]], f"names list {other}, which index shard 0 of 2 does not own"),
                           ([[mine], [mine]], "one list of IVF list ids per embedding")):
        body = {"embeddings": vector, "k": 10, **({"lists": lists} if lists is not None else {})}
        response = requests.post(f"{cluster.url(1)}/search", json=body, timeout=5)
        assert response.status_code == 400, response.text
        assert response.json()["field"] == "lists" and message in response.json()["error"]
    good = requests.post(f"{cluster.url(1)}/search", json={"embeddings": vector, "k": 3, "lists": [[mine]]}, timeout=5)
    assert good.status_code == 200 and len(good.json()["ids"][0]) == 3


def test_only_the_owning_shards_are_asked_and_a_replica_is_failed_over(cluster, version):
    """Shard 1 down: the queries whose lists all lie in shard 0 are still answered (shard 1 is not asked),
    through shard 0's second replica once its first is killed too; the others fail naming shard 1."""
    result, whole = version
    client = sharded_client(cluster, result)
    try:
        vectors = queries(200, 3)
        router = client.routers(None)
        assert router is not None
        owners = router.owners[router.probe_lists(vectors)]
        only_0, needs_1 = vectors[(owners == 0).all(axis=1)], vectors[(owners == 1).any(axis=1)]
        assert len(only_0) and len(needs_1)
        cluster.kill_node(2)
        cluster.kill_node(1)
        expected_distances, expected_ids = whole.search(only_0, 10)
        ids, distances = client.search(only_0, 10)
        np.testing.assert_array_equal(np.array(ids), expected_ids)
        np.testing.assert_array_equal(np.array(distances, dtype=np.float32), expected_distances)
        with pytest.raises(ShardUnavailable, match="index shard 1 of 2"):
            client.search(needs_1[:1], 10, deadline=time.monotonic() + 3)
    finally:
        client.close()
