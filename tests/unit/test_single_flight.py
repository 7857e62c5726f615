"""The single-flight primitive (services.roles.single_flight) and the reply cache built on it:
leading, joining, failures, the callers' own rules under the lock, and many threads at once."""
from __future__ import annotations

import functools
import random
import threading

import pytest

from services.roles.caches import ResponseCache
from services.roles.single_flight import Entry, SingleFlight
from services.server.answer import FinalAnswer
from services.server.deadline import Deadline
from services.server.stream_response import collect

pytestmark = pytest.mark.timeout(60)


def test_the_first_caller_leads_and_later_ones_join_its_outcome():
    flights = SingleFlight()
    lead = flights.enter("k", meta="digest")
    assert lead.leads and not lead.joins and lead.flight.meta == "digest"
    follow = flights.enter("k", meta="ignored")  # the leader's meta stays
    assert follow.joins and follow.flight is lead.flight and follow.flight.meta == "digest"
    assert lead.flight.joiners == 1 and flights.stats().joining == 1
    flights.finish(lead.flight, 42)
    assert len(flights) == 0  # landed: the next caller leads again
    assert flights.wait(follow.flight, 5).result() == 42
    assert flights.stats() == type(flights.stats())(in_flight=0, joining=0, joined=1)
    assert flights.enter("k").leads


def test_a_failure_reaches_every_joiner_as_the_same_exception():
    flights = SingleFlight()
    lead, follow = flights.enter("k"), flights.enter("k")
    error = RuntimeError("boom")
    flights.fail(lead.flight, error)
    ended = flights.wait(follow.flight, 5)
    assert ended.exception() is error and len(flights) == 0


def test_a_wait_past_its_timeout_is_a_timeout_error_and_the_joiner_leaves():
    flights = SingleFlight()
    lead, follow = flights.enter("k"), flights.enter("k")
    with pytest.raises(TimeoutError):
        flights.wait(follow.flight, 0.01)
    assert lead.flight.joiners == 0 and flights.stats().joining == 0 and len(flights) == 1
    # A leader's own TimeoutError is its outcome, not the wait's: the ended future holds it.
    late = flights.enter("k")
    flights.fail(lead.flight, TimeoutError("the leader's deadline"))
    assert str(flights.wait(late.flight, 5).exception()) == "the leader's deadline"


def test_the_callers_rules_decide_under_the_lock():
    flights = SingleFlight()
    assert flights.enter("k", lookup=lambda: "known") == Entry(value="known")  # a known value: no flight
    assert len(flights) == 0
    assert flights.enter("k", admit_leader=lambda in_flight: "hit") == Entry(value="hit")
    seen = []

    def refuse(in_flight):
        seen.append(in_flight)
        raise OverflowError("full")

    lead = flights.enter("k", admit_leader=lambda in_flight: seen.append(in_flight))
    with pytest.raises(OverflowError):
        flights.enter("other", admit_leader=refuse)
    assert seen == [0, 1] and len(flights) == 1  # refused: no flight made

    def cap_one(flight, joining):
        seen.append((flight.joiners, joining))
        if flight.joiners >= 1:
            raise OverflowError("one joiner per key")

    assert flights.enter("k", admit_joiner=cap_one).joins
    with pytest.raises(OverflowError):
        flights.enter("k", admit_joiner=cap_one)
    assert seen[-2:] == [(0, 0), (1, 1)] and flights.stats().joined == 1  # the refused one is not counted
    flights.finish(lead.flight, "v")


def test_32_threads_on_4_keys_each_get_exactly_their_leaders_outcome():
    # Every round: all 32 callers enter before any leader ends, so each key has one leader and
    # 7 joiners; the leaders of about half the keys fail. Bounded by barriers, no sleeps.
    flights, threads, keys, rounds = SingleFlight(), 32, 4, 20
    rng = random.Random(1)
    fails = {(r, k): rng.random() < 0.5 for r in range(rounds) for k in range(keys)}
    assert 0 < sum(fails.values()) < len(fails)
    entered = threading.Barrier(threads)
    outcomes: dict[tuple[int, int], object] = {}  # (round, caller) -> the value or the exception it got
    led: dict[tuple[int, int], object] = {}  # (round, key) -> what its leader ended it with
    errors: list[BaseException] = []

    def caller(i):
        try:
            for r in range(rounds):
                key = (r, i % keys)
                entry = flights.enter(key)
                entered.wait(timeout=30)
                if entry.leads:
                    outcome = RuntimeError(f"{key} failed") if fails[key] else object()
                    led[key] = outcome
                    if fails[key]:
                        flights.fail(entry.flight, outcome)
                    else:
                        flights.finish(entry.flight, outcome)
                else:
                    ended = flights.wait(entry.flight, 30)
                    outcome = ended.exception() or ended.result()
                assert (r, i) not in outcomes
                outcomes[(r, i)] = outcome
                entered.wait(timeout=30)  # the round is over for everyone before the next begins
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)
            entered.abort()

    pool = [threading.Thread(target=caller, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=60)
    assert errors == [] and not any(t.is_alive() for t in pool)
    assert len(outcomes) == rounds * threads and len(led) == rounds * keys
    for (r, i), outcome in outcomes.items():
        assert outcome is led[(r, i % keys)]  # the very object its leader ended with
    assert len(flights) == 0
    assert flights.stats() == type(flights.stats())(in_flight=0, joining=0, joined=rounds * (threads - keys))


def test_free_running_callers_never_lose_an_outcome():
    # No rounds: a caller may lead, join, or come just after a flight landed and lead again.
    flights, threads, calls = SingleFlight(), 32, 200
    start = threading.Barrier(threads)
    lock = threading.Lock()
    led: dict[object, object] = {}  # flight -> its outcome
    got: list[tuple[object, object]] = []  # (flight, outcome) per joiner
    counted = [0]
    errors: list[BaseException] = []

    def caller(i):
        rng = random.Random(i)
        try:
            start.wait(timeout=30)
            for _ in range(calls):
                entry = flights.enter(rng.randrange(4))
                if entry.leads:
                    outcome = RuntimeError("failed") if rng.random() < 0.5 else object()
                    with lock:
                        led[entry.flight] = outcome
                    (flights.fail if isinstance(outcome, Exception) else flights.finish)(entry.flight, outcome)
                else:
                    ended = flights.wait(entry.flight, 30)
                    with lock:
                        got.append((entry.flight, ended.exception() or ended.result()))
                with lock:
                    counted[0] += 1
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=caller, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=60)
    assert errors == [] and counted[0] == threads * calls == len(led) + len(got)
    assert all(outcome is led[flight] for flight, outcome in got)
    assert len(flights) == 0 and flights.stats().joining == 0 and flights.stats().joined == len(got)


def test_32_threads_on_4_questions_through_the_reply_cache_recompute_after_a_failed_leader():
    # Each round: 8 askers per question; its leader ends only once the other 7 wait on it, and
    # about half the leaders fail. A failure is never shared: those 7 compute their own answer.
    cache, threads, keys, rounds = ResponseCache(1024, 0), 32, 4, 10
    rng = random.Random(2)
    fails = {(r, k): rng.random() < 0.5 for r in range(rounds) for k in range(keys)}
    assert 0 < sum(fails.values()) < len(fails)
    waiting: dict[str, int] = {}
    all_waiting = {f"q{r}-{k}": threading.Event() for r in range(rounds) for k in range(keys)}
    lock = threading.Lock()
    flights_wait = cache._flights.wait

    def counting_wait(flight, timeout_s):  # tells the leader when its 7 joiners are in
        question = flight.key[1]  # keyed (caller, normalised question); no caller here
        with lock:
            waiting[question] = waiting.get(question, 0) + 1
            if waiting[question] == threads // keys - 1:
                all_waiting[question].set()
        return flights_wait(flight, timeout_s)

    cache._flights.wait = counting_wait
    computed: dict[tuple[int, int], str] = {}  # (round, caller) -> how it computed, if it did
    outcomes: dict[tuple[int, int], object] = {}
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def compute(r, i):  # only the leader, and later the joiners of a failed one, come here
        k, question = i % keys, f"q{r}-{i % keys}"
        if (r, k) not in _leaders:
            _leaders[(r, k)] = i
            assert all_waiting[question].wait(30), "the joiners never came"
            computed[(r, i)] = "led"
            if fails[(r, k)]:
                raise RuntimeError(f"leader of {question} failed")
        else:
            computed[(r, i)] = "recomputed"
        return FinalAnswer(f"r{r}-{i}", f"{question} by {i}", "neutral", "false")

    def caller(i):
        try:
            for r in range(rounds):
                start.wait(timeout=30)
                try:
                    stream = functools.partial(lambda r, i: iter([compute(r, i)]), r, i)
                    outcomes[(r, i)] = collect(cache.answer(f"r{r}-{i}", f"q{r}-{i % keys}", stream, Deadline.after(30)))
                except RuntimeError as exc:
                    outcomes[(r, i)] = exc
        except BaseException as exc:
            errors.append(exc)
            start.abort()

    _leaders: dict[tuple[int, int], int] = {}  # (round, question) -> the caller that led it
    pool = [threading.Thread(target=caller, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=60)
    assert errors == [] and len(outcomes) == rounds * threads
    for (r, i), outcome in outcomes.items():
        k = i % keys
        leader = _leaders[(r, k)]
        if i == leader:
            assert computed[(r, i)] == "led"
            assert isinstance(outcome, RuntimeError) if fails[(r, k)] else outcome.generated_response.endswith(
                f"by {i}")
        elif fails[(r, k)]:  # its leader failed: it computed its own answer, and got it
            assert computed[(r, i)] == "recomputed" and outcome.generated_response == f"q{r}-{k} by {i}"
        else:  # the leader's answer, addressed to this request
            assert (r, i) not in computed
            assert outcome == FinalAnswer(f"r{r}-{i}", f"q{r}-{k} by {leader}", "neutral", "false", cached=True)
    assert cache.in_flight() == 0 and cache.stats().joined == rounds * (threads - keys)
    assert cache.stats().entries == sum(not failed for failed in fails.values())  # failures are not cached
