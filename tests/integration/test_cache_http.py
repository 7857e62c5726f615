"""The reply cache's single flight over HTTP, on a real cluster."""
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.helpers import start_cluster
from tests.support import slow_index_command

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------- on a real cluster

@pytest.fixture(scope="module")
def cached_cluster(course_data, tmp_path_factory):
    # Node 2 holds every search 1.5 s, so askers that arrive together overlap for sure.
    cluster = start_cluster(course_data, tmp_path_factory.mktemp("cache-logs"), RESPONSE_CACHE_SIZE="64",
                            commands={2: slow_index_command(1500)})
    yield cluster
    cluster.stop()


def _served(cluster) -> int:
    return sum(requests.get(f"{cluster.url(n)}/health", timeout=10).json()["served"] for n in (0, 1))


def _joined(cluster) -> float:
    text = requests.get(f"{cluster.url(0)}/metrics", timeout=10).text
    line = next(line for line in text.splitlines() if line.startswith('rag_cache_joined_total{cache="response"}'))
    return float(line.split()[-1])


@pytest.mark.timeout(300)
def test_the_same_question_asked_together_is_computed_once_over_http(cached_cluster):
    url, askers = cached_cluster.url(0), 6
    served, joined = _served(cached_cluster), _joined(cached_cluster)
    barrier = threading.Barrier(askers)
    spellings = ["How do I reset my password?", "how do I reset my password?", "  How do I  reset my password? "]

    def ask(i):
        barrier.wait(timeout=30)
        return requests.post(f"{url}/query", json={"request_id": f"sf-{i}", "query": spellings[i % 3]}, timeout=120)

    with ThreadPoolExecutor(askers) as pool:
        replies = list(pool.map(ask, range(askers)))
    assert [r.status_code for r in replies] == [200] * askers
    bodies = [r.json() for r in replies]
    assert [b["request_id"] for b in bodies] == [f"sf-{i}" for i in range(askers)]
    assert len({b["generated_response"] for b in bodies}) == 1
    assert _served(cached_cluster) - served == 1 and _joined(cached_cluster) - joined == askers - 1
    again = requests.post(f"{url}/query", json={"request_id": "sf-again", "query": spellings[0]}, timeout=120)
    assert again.json()["cached"] is True and again.json()["request_id"] == "sf-again"
    assert _served(cached_cluster) - served == 1
    assert requests.post(f"{url}/cache/clear", timeout=10).json()["cleared"]["response"] == 1
    fresh = requests.post(f"{url}/query", json={"request_id": "sf-fresh", "query": spellings[0]}, timeout=120)
    assert fresh.status_code == 200 and "cached" not in fresh.json()
    assert _served(cached_cluster) - served == 2
