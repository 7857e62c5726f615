"""The clusters integration tests share (tests/support/shared_cluster.py): each started by the first test
that asks for it, stopped at the session's end, and after every test that used it waited for until it
is whole and idle again; a test that left it otherwise errors in its teardown."""
from __future__ import annotations

import functools

import pytest

from tests.support.shared_cluster import KEYED_CACHE, PLAIN, start_shared_cluster

SHARED = ("shared_cluster", "keyed_cache_cluster")


@pytest.fixture(scope="session")
def shared_cluster(support_data, tmp_path_factory):
    cluster = start_shared_cluster(PLAIN, support_data, tmp_path_factory.mktemp("shared-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def keyed_cache_cluster(course_data, tmp_path_factory):
    cluster = start_shared_cluster(KEYED_CACHE, course_data, tmp_path_factory.mktemp("keyed-cache-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def reference_answer(reference):
    """`reference.answer`, each query computed once a session: greedy, its answer never changes, and the
    modules on the shared cluster compare the same queries with it (the request_id is the caller's)."""
    computed = functools.cache(reference.answer)

    def answer(query: str, request_id: str = "") -> dict:
        return {**computed(query), "request_id": request_id}

    return answer


@pytest.fixture(autouse=True)
def _shared_clusters_left_as_found(request):
    yield
    for name in SHARED:
        if name in request.fixturenames:
            try:
                cluster = request.getfixturevalue(name)
            except Exception:  # it did not start: the test's setup error says why
                continue
            left = cluster.settle()
            assert not left, f"{request.node.nodeid} left the {name} otherwise than it found it: {left}"
