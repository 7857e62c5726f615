"""The LRU caches: eviction order, time to live, counters, thread safety, query normalisation, single flight."""
import dataclasses
import threading

import pytest

from services.roles.caches import LruCache, ResponseCache, normalise_query
from services.roles.single_flight import Entry
from services.server.answer import AnswerPiece, FinalAnswer
from services.server.deadline import Deadline
from services.server.stream_response import collect
from tests.helpers import ManualClock


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


def test_first_in_first_out_mode_evicts_by_age_and_purges_expired_entries_eagerly():
    clock = ManualClock()
    cache = LruCache("fifo", 3, ttl_s=5, clock=clock, refresh_on_read=False)
    for i, key in enumerate("abc"):
        clock.now = float(i)
        cache.put(key, i)
    assert cache.get("a") == 0  # a read does not make "a" young again
    cache.put("d", 3)  # evicts a, the oldest
    assert cache.get("a") is None and cache.get("b") == 1
    clock.now = 6.5  # b (t=1) has expired, c (t=2) has not
    assert cache.purge_expired() == 1 and cache.stats().entries == 2
    clock.now = 100.0
    assert cache.purge_expired() == 2 and cache.stats().entries == 0
    assert LruCache("lru", 3, ttl_s=5).purge_expired() == 0  # LRU order is not by age: expires lazily


def test_ttl_expires_entries():
    clock = ManualClock()
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
    cache.put("What is your  refund policy?", FinalAnswer("r1", "A", "neutral", "false"))
    hit = cache.get("r2", "  what IS your refund policy? ")
    assert hit == FinalAnswer("r2", "A", "neutral", "false", cached=True)
    assert cache.get("r3", "What is your refund policy") is None  # punctuation changes the question
    assert normalise_query(" A\tb  C ") == "a b c"


REPLY = FinalAnswer("lead", "A", "neutral", "false", finish_reason="stop", served_by=1, stages_ms={"generate": 9.0})


def addressed(request_id: str, **changes) -> FinalAnswer:
    return dataclasses.replace(REPLY, request_id=request_id, **changes)


def test_a_repeat_in_flight_joins_the_first_computation():
    cache = ResponseCache(4, ttl_s=0)
    lead = cache.enter("r1", "Where is my order?")
    assert lead.leads and lead.flight.key == (None, "where is my order?", "") and lead.value is None
    follow = cache.enter("r2", "where is  MY order?")
    assert follow.joins and follow.flight is lead.flight
    other = cache.enter("r3", "Something else")
    # A different question leads its own computation.
    assert other.leads and other.flight.key == (None, "something else", "")
    cache.finish(lead, REPLY)
    joined = cache.joined_reply(follow, "r2", Deadline.after(5))
    assert joined == addressed("r2", cached=True)
    hit = cache.enter("r4", "Where is my order?")
    assert hit.value == addressed("r4", cached=True)
    st = cache.stats()
    assert (st.hits, st.misses, st.joined, st.entries) == (1, 3, 1, 1)
    assert cache.in_flight() == 1  # "something else" is still being computed


def test_the_same_question_in_another_conversation_neither_joins_nor_hits_the_first():
    cache = ResponseCache(4, ttl_s=0)
    lead = cache.enter("r1", "and to Canada?", conversation="norway")
    other = cache.enter("r2", "and to Canada?", conversation="laptops")
    alone = cache.enter("r3", "and to Canada?")
    assert lead.leads and other.leads and alone.leads and len({id(e.flight) for e in (lead, other, alone)}) == 3
    cache.finish(lead, REPLY)
    assert cache.get("r4", "and to Canada?", conversation="laptops") is None
    assert cache.get("r5", "and to Canada?") is None
    assert cache.get("r6", "And to  Canada?", conversation="norway") == addressed("r6", cached=True)


def test_a_failed_computation_is_not_shared_nor_cached():
    cache = ResponseCache(4, ttl_s=0)
    lead = cache.enter("r1", "q")
    follow = cache.enter("r2", "q")
    cache.fail(lead, RuntimeError("worker failed"))
    assert cache.joined_reply(follow, "r2", Deadline.after(5)) is None  # it computes its own
    again = cache.enter("r3", "q")
    assert again.leads and again.flight.key == (None, "q", "") and cache.stats().entries == 0
    with pytest.raises(TimeoutError):
        cache.joined_reply(cache.enter("r4", "q"), "r4", Deadline.after(0.01))


def test_with_the_cache_off_nothing_is_shared():
    cache = ResponseCache(0, ttl_s=0)
    first, second = cache.enter("r1", "q"), cache.enter("r2", "q")
    assert first == second == Entry()  # compute alone
    cache.finish(first, REPLY)
    assert cache.enter("r3", "q") == Entry() and cache.in_flight() == 0


def test_answer_computes_a_question_once_and_never_caches_a_failure():
    # (Joiners of a failed leader computing their own answer: tests/unit/test_single_flight.py.)
    cache = ResponseCache(4, ttl_s=0)
    computed = [AnswerPiece("A"), addressed("r1")]
    assert collect(cache.answer("r1", "Q", lambda: iter(computed), Deadline.after(5))) == addressed("r1")
    hit = list(cache.answer("r2", "q", lambda: pytest.fail("a hit computes nothing"), Deadline.after(5)))
    assert hit == [AnswerPiece("A"), addressed("r2", cached=True)]  # a hit replayed, its text one piece

    def failing():
        yield AnswerPiece("partial")
        raise RuntimeError("worker failed")

    with pytest.raises(RuntimeError, match="worker failed"):
        collect(cache.answer("r3", "other", failing, Deadline.after(5)))
    assert cache.in_flight() == 0 and cache.stats().entries == 1


def test_many_askers_of_one_question_compute_it_once():
    cache = ResponseCache(16, ttl_s=0)
    askers = 24
    claimed = threading.Barrier(askers)
    computed, replies = [], {}

    def ask(i):
        entry = cache.enter(f"r{i}", "How do I reset my password?")
        claimed.wait(timeout=30)  # nobody finishes before everyone has asked
        if entry.leads:
            computed.append(i)
            cache.finish(entry, dataclasses.replace(REPLY, request_id=f"r{i}", generated_response=f"by {i}"))
            replies[i] = f"by {i}"
        else:
            replies[i] = cache.joined_reply(entry, f"r{i}", Deadline.after(30))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(askers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(computed) == 1
    leader_text = replies[computed[0]]
    for i in range(askers):
        if i != computed[0]:
            assert replies[i].request_id == f"r{i}" and replies[i].generated_response == leader_text
    assert cache.stats().joined == askers - 1 and cache.in_flight() == 0
