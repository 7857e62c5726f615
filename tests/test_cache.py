"""The LRU caches: eviction order, time to live, counters, thread safety, query normalisation."""
import threading

import pytest

from services.cache import LruCache, ResponseCache, normalise_query


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_lru_evicts_least_recently_used_and_counts():
    cache = LruCache("c", 2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)  # evicts b
    assert cache.get("b") is None and cache.get("c") == 3 and cache.get("a") == 1
    st = cache.stats()
    assert (st.entries, st.hits, st.misses, st.evictions) == (2, 3, 1, 1)
    assert cache.clear() == 2 and cache.get("a") is None


def test_ttl_expires_entries():
    clock = Clock()
    cache = LruCache("c", 10, ttl_s=5, clock=clock)
    cache.put("k", "v")
    clock.now = 4.9
    assert cache.get("k") == "v"
    clock.now = 5.1
    assert cache.get("k") is None and cache.stats().entries == 0


def test_size_zero_is_off():
    cache = LruCache("c", 0)
    cache.put("k", "v")
    assert cache.get("k") is None and not cache.enabled
    with pytest.raises(ValueError):
        LruCache("c", -1)


def test_concurrent_use_keeps_the_bound_and_the_counts():
    cache = LruCache("c", 50)
    barrier = threading.Barrier(16)

    def work(t):
        barrier.wait()
        for i in range(500):
            cache.put((t, i % 80), i)
            cache.get((t, (i * 7) % 80))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    st = cache.stats()
    assert st.entries <= 50 and st.hits + st.misses == 16 * 500
    assert 0 < st.evictions <= 16 * 500 - st.entries  # only puts of absent keys beyond the bound evict


def test_response_cache_normalises_and_readdresses():
    cache = ResponseCache(4, ttl_s=0)
    cache.put("What is your  refund policy?", {"request_id": "r1", "generated_response": "A", "sentiment": "neutral",
                                                "is_toxic": "false"})
    hit = cache.get("r2", "  what IS your refund policy? ")
    assert hit["request_id"] == "r2" and hit["generated_response"] == "A" and hit["cached"] is True
    assert cache.get("r3", "What is your refund policy") is None  # punctuation changes the question
    assert normalise_query(" A\tb  C ") == "a b c"
