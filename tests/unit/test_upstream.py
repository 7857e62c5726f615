"""services/stages/upstream.py: which stages the requests in flight on a node may still submit to,
and the wake each stage gets when its last such request passes it by or ends."""
from __future__ import annotations

import random
import threading
from collections import Counter

from pipeline.spec import WORKER_STAGES, Stage
from services.stages.upstream import Upstream

EMBED, SEARCH, FETCH, RERANK, GENERATE, SENTIMENT, TOXICITY = WORKER_STAGES


def counts(upstream: Upstream) -> dict[str, int]:
    return {stage: upstream.may_join(stage) for stage in WORKER_STAGES}


def test_a_request_counts_for_the_stages_ahead_of_it_until_it_passes_them_or_ends():
    upstream = Upstream()
    woken: Counter = Counter()
    for stage in WORKER_STAGES:
        upstream.watch(stage, lambda stage=stage: woken.update([stage]))
    answer = upstream.begin(WORKER_STAGES)
    moderation = upstream.begin((TOXICITY,))  # /v1/moderations: toxicity only
    assert counts(upstream) == {stage: 1 for stage in WORKER_STAGES} | {TOXICITY: 2}
    answer.passed(SEARCH)  # an embed cache hit: embed was skipped, and search is behind it too
    assert counts(upstream) == {EMBED: 0, SEARCH: 0, FETCH: 1, RERANK: 1, GENERATE: 1, SENTIMENT: 1, TOXICITY: 2}
    assert woken == {EMBED: 1, SEARCH: 1}  # each fell to none: its waiting batch may close
    answer.passed(FETCH, SEARCH)  # a wait with several stages entered: through the furthest
    answer.passed(EMBED)  # behind it already: nothing changes
    assert counts(upstream)[FETCH] == 0 and counts(upstream)[RERANK] == 1 and woken[FETCH] == 1
    moderation.passed(TOXICITY)
    assert counts(upstream)[TOXICITY] == 1 and TOXICITY not in woken  # the answer may still come
    answer.end()  # an error, or the answer's end: it counts nowhere now
    answer.end()
    moderation.end()
    assert counts(upstream) == {stage: 0 for stage in WORKER_STAGES}
    assert woken == {stage: 1 for stage in WORKER_STAGES}


def test_a_stage_no_route_names_has_nobody_to_wait_for_and_an_unwatched_queue_is_not_woken():
    upstream = Upstream()
    woken: list[str] = []

    def wake() -> None:
        woken.append("index")

    upstream.watch(Stage.INDEX, wake)
    assert upstream.may_join(Stage.INDEX) == 0
    with upstream.begin((Stage.INDEX,)):  # a /search call until its vectors are queued
        assert upstream.may_join("index") == 1  # a stage is its own name
    assert upstream.may_join(Stage.INDEX) == 0 and woken == ["index"]
    upstream.unwatch(Stage.INDEX, wake)
    upstream.unwatch(Stage.INDEX, wake)  # a service closed twice
    upstream.begin((Stage.INDEX,)).end()
    assert woken == ["index"]


def test_stress_many_requests_passing_skipping_and_ending_leave_every_count_at_zero():
    upstream = Upstream()
    n_threads, per_thread = 16, 300
    woken: Counter = Counter()
    woken_lock = threading.Lock()

    def waker(stage: str):
        def wake() -> None:
            # Called with no lock of the registry held: it may look at the counts again.
            assert 0 <= upstream.may_join(stage) <= n_threads
            with woken_lock:
                woken[stage] += 1
        return wake

    for stage in WORKER_STAGES:
        upstream.watch(stage, waker(stage))
    start = threading.Barrier(n_threads + 1)
    errors: list[BaseException] = []
    out_of_range = threading.Event()
    done = threading.Event()

    def request_thread(seed: int) -> None:
        rng = random.Random(seed)
        try:
            start.wait()
            for _ in range(per_thread):
                route = WORKER_STAGES if rng.random() < 0.8 else (rng.choice(WORKER_STAGES),)
                with upstream.begin(route) as request:
                    for stage in route:
                        choice = rng.random()
                        if choice < 0.15:
                            continue  # skipped (a cache hit)
                        if choice < 0.2:
                            break  # an error: the request ends early
                        request.passed(stage)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def observer() -> None:
        start.wait()
        while not done.is_set():
            if any(count < 0 or count > n_threads for count in counts(upstream).values()):
                out_of_range.set()

    threads = [threading.Thread(target=request_thread, args=(seed,)) for seed in range(n_threads)]
    watching = threading.Thread(target=observer)
    for thread in (*threads, watching):
        thread.start()
    for thread in threads:
        thread.join(120)
    done.set()
    watching.join(30)
    assert not any(thread.is_alive() for thread in (*threads, watching)), "threads hung"
    assert not errors, errors[:3]
    assert not out_of_range.is_set()
    assert counts(upstream) == {stage: 0 for stage in WORKER_STAGES}
    assert all(woken[stage] >= 1 for stage in WORKER_STAGES)


def test_stress_batching_services_with_ten_minute_windows_close_every_batch_by_the_count_alone():
    """Three stage services on one Upstream, windows of ten minutes: every batch closes because it
    filled up or nobody could join it any more; a lost wake (or a lock taken in both orders) would
    leave a caller waiting on the window and fail its result's bound."""
    from services.stages.batching import BatchingService
    upstream = Upstream()
    stages = ("a", "b", "c")
    sizes: Counter = Counter()
    sizes_lock = threading.Lock()

    def batch_fn(items):
        with sizes_lock:
            sizes[len(items)] += 1
        return [item * 2 for item in items]

    services = {stage: BatchingService(stage, batch_fn, max_size=8, max_wait_ms=600_000, upstream=upstream)
                for stage in stages}
    n_threads, per_thread = 12, 60
    start = threading.Barrier(n_threads)
    errors: list[BaseException] = []

    def request_thread(seed: int) -> None:
        rng = random.Random(seed)
        try:
            start.wait()
            for n in range(per_thread):
                with upstream.begin(stages) as route:
                    for stage in stages:
                        if rng.random() < 0.2:
                            continue  # skipped: the next wait (or the end) passes it
                        items = [seed * 1000 + n] * rng.randint(1, 3)  # several items, one request
                        futures = [services[stage].submit(item) for item in items]
                        route.passed(stage)  # as StageClock.wait: all its items are in
                        assert [future.result(timeout=60) for future in futures] == [item * 2 for item in items]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=request_thread, args=(seed,)) for seed in range(n_threads)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert not any(thread.is_alive() for thread in threads), "requests hung"
        assert not errors, errors[:3]
    finally:
        for service in services.values():
            service.close(timeout=30)
    assert {stage: upstream.may_join(stage) for stage in stages} == {stage: 0 for stage in stages}
    assert max(sizes) > 3, "no request shared a batch with another"
