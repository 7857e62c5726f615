"""An index node's data versions through its routes (Flask's test client): a search names the version
it reads and the answer says which one did; /data loads, switches and releases versions."""
from __future__ import annotations

import numpy as np
import pytest

from builders.data import build_course
from builders.incremental import Changes, update_version
from builders.manifest import random_vectors
from pipeline.docstore import Document
from tests.helpers import index_node_app

DIM = 16


@pytest.fixture
def index_node(tmp_path):
    build_course(tmp_path / "v1", 200, dim=DIM, progress=False)
    vector = {5000: np.full(DIM, 7.0, dtype=np.float32)}  # far from every random vector in [0, 1)
    update_version(tmp_path / "v1", tmp_path / "v2", Changes((Document(5000, "t", "c", "g"),), (0,)),
                   lambda texts: np.stack([vector[5000]] * len(texts)), random_vectors(DIM))
    with index_node_app(tmp_path / "v1" / "faiss_index.bin") as (role, client):
        yield role, client, vector[5000]


def search(client, vector, version=None):
    body = {"embeddings": [vector.tolist()], "k": 1, **({"version": version} if version else {})}
    return client.post("/search", json=body)


def test_a_search_reads_the_version_it_names_and_says_which_answered(index_node):
    role, client, far = index_node
    r = search(client, far)
    assert r.status_code == 200 and r.get_json()["version"] == "v1" and r.get_json()["ids"][0] != [5000]
    assert client.post("/data/load", json={"version": "v2"}).status_code == 200
    assert search(client, far).get_json()["version"] == "v1"  # loaded beside it, not switched to
    r = search(client, far, "v2")
    assert r.get_json() == {"version": "v2", "ids": [[5000]], "distances": [[0.0]]}
    assert client.post("/data/switch", json={"version": "v2"}).status_code == 200
    assert search(client, far).get_json()["version"] == "v2"
    assert client.post("/data/release", json={"version": "v2"}).status_code == 409  # the current one
    assert client.post("/data/release", json={"version": "v1", "timeout_s": 5}).status_code == 200
    assert client.get("/data").get_json()["current"] == "v2"
    assert [v["version"] for v in client.get("/data").get_json()["loaded"]] == ["v2"]
    health = client.get("/health").get_json()
    assert health["data_version"] == "v2" and health["ntotal"] == 200


def test_a_search_naming_a_version_it_does_not_hold_loads_it_from_disk_or_answers_503(index_node):
    role, client, far = index_node
    assert search(client, far, "v2").get_json()["ids"] == [[5000]]  # complete beside v1: loaded
    r = search(client, far, "v9")
    assert r.status_code == 503 and "v9" in r.get_json()["error"]
    r = client.post("/search", json={"embeddings": [far.tolist()], "version": 3})
    assert r.status_code == 400 and r.get_json()["field"] == "version"
    r = client.post("/data/load", json={"version": "../v1"})
    assert r.status_code == 400 and r.get_json()["field"] == "version"


def test_health_and_metrics_show_the_recall_each_version_was_built_with(index_node):
    from pipeline.data_version import shard_recall
    role, client, _ = index_node
    body = client.get("/health").get_json()
    with role.data.require().versions.use() as lease:
        manifest = lease.value.manifest
    assert body["recall_at_10"] == shard_recall(manifest, 0) == manifest.index["recall"]["shards"][0]
    assert body["recall_at_10_overall"] == manifest.index["recall"]["overall"]
    assert body["recall_params"] == {"nprobe": body["nprobe"]} and body["index_kind"] == manifest.index["spec"]
    assert body["sharding"] == "hash"  # a centroid version says "centroid" (tests/integration/test_centroid_shards.py)
    client.post("/data/load", json={"version": "v2"})
    metrics = client.get("/metrics").get_data(as_text=True)
    lines = [line for line in metrics.splitlines() if line.startswith("rag_index_recall_at_10{")]
    assert f'rag_index_recall_at_10{{shard="0",version="v1"}} {shard_recall(manifest, 0)}' in lines
