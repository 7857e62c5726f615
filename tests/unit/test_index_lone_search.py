"""Node 2's index batch closes at once when no other /search call received may still join it
(services/stages/upstream.py): with a ten-second INDEX_MAX_WAIT_MS a lone search is answered in far
less, and a call still being read holds the batch until its vectors are queued or it fails."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from builders.data import build_course
from pipeline.spec import Stage
from tests.helpers import index_node_app, wait_until

DIM = 16
FAR_LESS_S = 5.0  # the window is 10 s


@pytest.fixture
def index_node(tmp_path):
    build_course(tmp_path / "v1", 200, dim=DIM, progress=False)
    with index_node_app(tmp_path / "v1" / "faiss_index.bin", INDEX_MAX_WAIT_MS="10000") as (role, client):
        assert [service.max_wait_ms for service in role.batching_services()] == [10_000]
        yield role, client


def search(client):
    return client.post("/search", json={"embeddings": [np.full(DIM, 0.5).tolist()], "k": 3})


def test_a_lone_search_meets_no_window_and_a_refused_one_counts_no_more(index_node):
    role, client = index_node
    started = time.monotonic()
    r = search(client)
    assert r.status_code == 200 and len(r.get_json()["ids"][0]) == 3
    assert time.monotonic() - started < FAR_LESS_S
    assert client.post("/search", json={"embeddings": [[1.0]]}).status_code == 400
    assert role.upstream.may_join(Stage.INDEX) == 0


def test_a_search_still_being_read_holds_the_batch_until_it_leaves(index_node):
    role, client = index_node
    reading = role.upstream.begin((Stage.INDEX,))  # another call, its body still being parsed
    answered: list = []
    thread = threading.Thread(target=lambda: answered.append(search(client.application.test_client())), daemon=True)
    thread.start()
    try:
        wait_until(lambda: role.batching_services()[0].stats().queue_depth == 1
                   and role.upstream.may_join(Stage.INDEX) == 1, 30, "the search was never queued")
        assert not answered  # the window is ten seconds and the other call may still join
    finally:
        reading.end()  # it was refused (a bad body), or its vectors went into another batch
    thread.join(FAR_LESS_S)
    assert answered and answered[0].status_code == 200
