"""The reply cache's single flight over HTTP, on a real cluster: the shared one whose node 0 keeps a
reply cache (tests/support/shared_cluster.py KEYED_CACHE: a reply cache would answer the other
modules' repeated questions without a worker), its node 2 holding every search SLOW_SEARCH_MS
while the askers ask, so askers that arrive together overlap for sure."""
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.helpers import uid
from tests.support.shared_cluster import KEY

pytestmark = pytest.mark.slow

AUTH = {"Authorization": f"Bearer {KEY}"}
# How long node 2 holds each search while the askers ask.
SLOW_SEARCH_MS = 1000


def _served(cluster) -> int:
    return sum(requests.get(f"{cluster.url(n)}/health", timeout=10).json()["served"] for n in (0, 1))


def _joined(cluster) -> float:
    text = requests.get(f"{cluster.url(0)}/metrics", timeout=10).text
    line = next(line for line in text.splitlines() if line.startswith('rag_cache_joined_total{cache="response"}'))
    return float(line.split()[-1])


def _ask(url: str, request_id: str, query: str) -> requests.Response:
    return requests.post(f"{url}/query", json={"request_id": request_id, "query": query}, headers=AUTH, timeout=120)


@pytest.mark.timeout(300)
def test_the_same_question_asked_together_is_computed_once_over_http(keyed_cache_cluster):
    cluster = keyed_cache_cluster
    url, askers, prefix, tag = cluster.url(0), 6, uid("sf"), uid("order")
    # Other tests' replies out of the cache: what is cleared below is this test's alone.
    assert requests.post(f"{url}/cache/clear", timeout=10).status_code == 200
    served, joined = _served(cluster), _joined(cluster)
    barrier = threading.Barrier(askers)
    spellings = [f"How do I reset my password ({tag})?", f"how do I reset my password ({tag})?",
                 f"  How do I  reset my password ({tag})? "]

    def ask(i):
        barrier.wait(timeout=30)
        return _ask(url, f"{prefix}-{i}", spellings[i % 3])

    with ThreadPoolExecutor(askers) as pool, cluster.slow_index.delayed(SLOW_SEARCH_MS):
        replies = list(pool.map(ask, range(askers)))
    assert [r.status_code for r in replies] == [200] * askers
    bodies = [r.json() for r in replies]
    assert [b["request_id"] for b in bodies] == [f"{prefix}-{i}" for i in range(askers)]
    assert len({b["generated_response"] for b in bodies}) == 1
    assert _served(cluster) - served == 1 and _joined(cluster) - joined == askers - 1
    again = _ask(url, f"{prefix}-again", spellings[0])
    assert again.json()["cached"] is True and again.json()["request_id"] == f"{prefix}-again"
    assert _served(cluster) - served == 1
    assert requests.post(f"{url}/cache/clear", timeout=10).json()["cleared"]["response"] == 1
    fresh = _ask(url, f"{prefix}-fresh", spellings[0])
    assert fresh.status_code == 200 and "cached" not in fresh.json()
    assert _served(cluster) - served == 2
