"""Fault injection on real node processes (127.0.0.1, tiny stand-ins): every request gets
exactly one answer of an allowed kind, and no node process dies.

One cluster with small limits serves the whole module, so capacity, deadlines and the
cluster token are exercised together: CLUSTER_TOKEN is set (every /query below also
proves the nodes pass it to each other), REQUEST_TIMEOUT_S is short so a 504 comes
quickly, and GATEWAY_MAX_IN_FLIGHT / STAGE_MAX_QUEUE are tiny so a burst overflows them.
Node 2 runs as tests.support.slow_index_node: a test slows it, or holds its searches (requests stay
in flight until the test lets them go), by writing its delay, with no restart; one test kills it and
starts it again. The reply-cache test gets a second node 0 of its own in front of nodes 1 and 2; the
SIGTERM test stops node 0 and so comes last.
"""
from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pipeline import spec
from services.server.token import TOKEN_HEADER
from tests.helpers import health, post_query, start_cluster, uid, wait_until
from tests.support import SlowIndex
from tests.support.second_gateway import second_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOKEN = "faults-test-token"
REQUEST_TIMEOUT_S = 10.0
MAX_IN_FLIGHT = 4
# Joiners of a request_id in flight: 19 per id lets the 20-thread test below join in full;
# 24 in all stays under node 0's 32 spare HTTP threads.
MAX_JOINERS_PER_ID, MAX_JOINERS = 19, 24
AUTH = {TOKEN_HEADER: TOKEN}
# 409: a fuzzed request_id seen before with another query (a request_id is bound to its query).
QUERY_STATUSES = {200, 400, 409, 413, 415, 503, 504}


@pytest.fixture(scope="module")
def slow_index(tmp_path_factory) -> SlowIndex:
    return SlowIndex(tmp_path_factory.mktemp("faults-index") / "delay_ms")


@pytest.fixture(scope="module")
def cluster(course_data, tmp_path_factory, slow_index):
    cluster = start_cluster(course_data, tmp_path_factory.mktemp("faults-logs"), commands={2: slow_index.command()},
                            CLUSTER_TOKEN=TOKEN, REQUEST_TIMEOUT_S=str(REQUEST_TIMEOUT_S),
                            GATEWAY_MAX_IN_FLIGHT=str(MAX_IN_FLIGHT), STAGE_MAX_QUEUE="4", SEARCH_MAX_BATCH="4",
                            SHUTDOWN_GRACE_S="30", CONNECT_TIMEOUT_S="1",
                            GATEWAY_MAX_JOINERS_PER_ID=str(MAX_JOINERS_PER_ID),
                            GATEWAY_MAX_JOINERS=str(MAX_JOINERS))
    yield cluster
    cluster.stop()


@pytest.fixture(autouse=True)
def no_node_exits(request, cluster):
    """After every test: every node this test did not stop on purpose is still running."""
    yield
    stopped = getattr(request.node, "stopped_nodes", set())
    for node, proc in cluster.procs.items():
        if node not in stopped:
            assert proc.poll() is None, f"node {node} exited with {proc.returncode}:\n{cluster.tail(node)}"


def served_total(cluster) -> int:
    return sum(health(cluster, n)["served"] for n in (0, 1))


def assert_json_answer(response: requests.Response, allowed: set[int]) -> None:
    assert response.status_code in allowed, (response.status_code, response.text[:300])
    assert response.headers["Content-Type"].startswith("application/json"), response.text[:300]
    body = response.json()
    if response.status_code != 200:
        assert isinstance(body["error"], str) and body["error"]
    if response.status_code == 503:
        assert int(response.headers["Retry-After"]) >= 1


# ---------------------------------------------------------------- the cluster token

def test_internal_endpoints_refuse_callers_without_the_token(cluster):
    search = {"embeddings": [[0.01] * 768], "k": 10}
    internal = {"request_id": uid("tok"), "query": "Refund?"}
    for headers in ({}, {TOKEN_HEADER: "wrong"}, {TOKEN_HEADER: TOKEN.upper()}):
        r = requests.post(f"{cluster.url(2)}/search", json=search, headers=headers, timeout=10)
        assert r.status_code == 401 and r.json()["field"] == TOKEN_HEADER
        for node in (0, 1):
            r = requests.post(f"{cluster.url(node)}/internal/answer", json=internal, headers=headers, timeout=10)
            assert r.status_code == 401 and TOKEN_HEADER in r.json()["error"]
    assert requests.post(f"{cluster.url(2)}/search", json=search, headers=AUTH, timeout=10).status_code == 200
    r = requests.post(f"{cluster.url(1)}/internal/answer", json=internal, headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json()["served_by"] == 1


def test_query_health_and_metrics_stay_open_and_query_works_end_to_end(cluster):
    for node in (0, 1, 2):
        assert requests.get(f"{cluster.url(node)}/health", timeout=10).status_code == 200
        assert requests.get(f"{cluster.url(node)}/metrics", timeout=10).status_code == 200
    replies = [post_query(cluster, uid(f"open-{i}"), spec.REFERENCE_QUERIES[i]) for i in range(4)]
    assert [r.status_code for r in replies] == [200] * 4
    assert {r.json()["served_by"] for r in replies} == {0, 1}  # node 1 and node 2 both took the token


# ---------------------------------------------------------------- fuzzed bodies

JSON_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
                | st.text(max_size=20))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
HUGE_STRINGS = st.builds(lambda n, c: c * n, st.sampled_from([257, 4097, 20_000, 70_000]),
                         st.sampled_from(["x", "é", "😀", " "]))
FIELD_VALUES = st.text(max_size=40) | HUGE_STRINGS | JSON_VALUES
QUERY_BODIES = st.fixed_dictionaries({}, optional={"request_id": FIELD_VALUES, "query": FIELD_VALUES,
                                                   "timeout_s": JSON_SCALARS, "extra": JSON_VALUES})
CONTENT_TYPES = st.sampled_from(["application/json"] * 6 + ["application/json; charset=utf-8", "text/plain",
                                                            "application/x-www-form-urlencoded", ""])


def encode(body) -> bytes:
    return json.dumps(body).encode()  # NaN and Infinity go out as the bare words JSON parsers often accept


# Well-formed bodies with any Unicode (and huge) strings, so a good share reaches the models.
WELL_FORMED = st.fixed_dictionaries({"request_id": st.text(min_size=1, max_size=40),
                                     "query": st.text(min_size=1, max_size=300) | HUGE_STRINGS},
                                    optional={"extra": JSON_VALUES}).map(encode)
RAW_BODIES = st.one_of(WELL_FORMED, WELL_FORMED, st.binary(max_size=300), QUERY_BODIES.map(encode),
                       JSON_VALUES.map(encode), st.just(b"[" * 30_000),
                       st.just(b'{"request_id": "a", "query": "\\udc80"}'))
FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@FUZZ
@given(body=RAW_BODIES, content_type=CONTENT_TYPES)
def test_fuzzed_query_bodies_get_one_allowed_json_answer(cluster, body, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    response = requests.post(f"{cluster.url(0)}/query", data=body, headers=headers, timeout=60)
    event(f"HTTP {response.status_code}")  # --hypothesis-show-statistics shows the mix
    assert_json_answer(response, QUERY_STATUSES)
    if response.status_code == 200:
        assert response.json()["request_id"] == json.loads(body)["request_id"]


def vectors(dim: int, count: int, fill) -> list:
    return [[fill] * dim for _ in range(count)]


SEARCH_BODIES = st.fixed_dictionaries({}, optional={
    "embeddings": st.builds(vectors, st.sampled_from([0, 1, 767, 768, 768, 768, 769]), st.integers(0, 6),
                            st.floats(-10, 10) | st.floats(allow_nan=True, allow_infinity=True) | st.integers()
                            | JSON_SCALARS)
    | JSON_VALUES,
    "k": st.integers(-3, 2000) | JSON_SCALARS,
    "extra": JSON_VALUES})


WELL_FORMED_SEARCH = st.fixed_dictionaries({
    "embeddings": st.builds(vectors, st.just(768), st.integers(1, 5), st.floats(-10, 10) | st.integers(-5, 5)),
    "k": st.integers(1, 1024)}).map(encode)


@FUZZ
@given(body=st.one_of(WELL_FORMED_SEARCH, SEARCH_BODIES.map(encode), SEARCH_BODIES.map(encode), RAW_BODIES),
       content_type=CONTENT_TYPES)
def test_fuzzed_search_bodies_get_one_allowed_json_answer(cluster, body, content_type):
    headers = {**AUTH, **({"Content-Type": content_type} if content_type else {})}
    response = requests.post(f"{cluster.url(2)}/search", data=body, headers=headers, timeout=60)
    event(f"HTTP {response.status_code}")
    assert_json_answer(response, QUERY_STATUSES)
    if response.status_code == 200:
        ids = response.json()["ids"]
        assert len(ids) == len(json.loads(body)["embeddings"])


# ---------------------------------------------------------------- idempotency and capacity

def test_same_request_id_from_20_threads_is_computed_once(cluster):
    request_id, before = uid("same"), served_total(cluster)
    barrier = threading.Barrier(20)

    def send(_):
        barrier.wait()
        return post_query(cluster, request_id)

    with ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(send, range(20)))
    assert [r.status_code for r in responses] == [200] * 20
    assert len({r.text for r in responses}) == 1
    assert served_total(cluster) - before == 1
    hits = idempotency_hits(cluster)
    assert post_query(cluster, request_id).text == responses[0].text  # from the cache
    assert served_total(cluster) - before == 1
    assert idempotency_hits(cluster) == hits + 1  # counted in /metrics


def idempotency_hits(cluster) -> float:
    text = requests.get(f"{cluster.url(0)}/metrics", timeout=10).text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith('rag_cache_hits_total{cache="idempotency"}')))


def burst(url: str, n: int, headers=None, body=lambda i: {}) -> list[requests.Response]:
    barrier = threading.Barrier(n)

    def send(i):
        barrier.wait()
        return requests.post(url, json=body(i), headers=headers or {}, timeout=30)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(send, range(n)))


def test_burst_of_4x_capacity_gets_200_or_immediate_503_and_the_cluster_recovers(cluster):
    tag = uid("burst")
    started = time.monotonic()
    responses = burst(f"{cluster.url(0)}/query", 4 * MAX_IN_FLIGHT,
                      body=lambda i: {"request_id": f"{tag}-{i}", "query": spec.REFERENCE_QUERIES[i % 8]})
    assert time.monotonic() - started < 30
    for r in responses:
        assert_json_answer(r, {200, 503})
    statuses = [r.status_code for r in responses]
    print("gateway burst:", statuses)
    assert statuses.count(503) >= 1 and statuses.count(200) >= 1, statuses
    assert health(cluster, 0)["gateway"]["rejected"] >= 1  # the gateway's own limit refused some

    # Straight at node 1, past the gateway: its stage queues (STAGE_MAX_QUEUE=4) are the bound.
    direct = burst(f"{cluster.url(1)}/internal/answer", 16, headers=AUTH,
                   body=lambda i: {"request_id": f"{tag}-direct-{i}", "query": "Refund?"})
    for r in direct:
        assert_json_answer(r, {200, 503})
    print("node 1 burst:", [r.status_code for r in direct])

    wait_until(lambda: all(w["up"] for w in health(cluster, 0)["workers"]), 10, "a worker stayed out")
    after = [post_query(cluster, f"{tag}-after-{i}") for i in range(4)]
    assert [r.status_code for r in after] == [200] * 4


# ---------------------------------------------------------------- node 2 down, slow, back

def searches_taken(cluster, node: int) -> int:
    """Items a worker's search stage has taken or holds (a search in progress included)."""
    search = health(cluster, node)["stages"]["search"]
    return search["items"] + search["queue_depth"]


def log_since(cluster, node: int, offset: int) -> str:
    return cluster.log_path(node).read_bytes()[offset:].decode(errors="replace")


def test_node_2_killed_then_back_waiting_requests_succeed(cluster, slow_index):
    workers = (0, 1)
    taken = {n: searches_taken(cluster, n) for n in workers}
    logged = {n: cluster.log_path(n).stat().st_size for n in workers}
    cluster.kill_node(2)
    tag, results = uid("n2"), {}

    def send(i):
        results[i] = post_query(cluster, f"{tag}-{i}", spec.REFERENCE_QUERIES[i])

    def retrying() -> bool:
        """Every request is in a search stage, and each worker holding one has logged a retry."""
        held = {n: searches_taken(cluster, n) - taken[n] for n in workers}
        return sum(held.values()) == 3 and all("retrying in" in log_since(cluster, n, logged[n])
                                               for n in workers if held[n])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    started = time.monotonic()
    for t in threads:
        t.start()
    wait_until(retrying, 5, "the requests are not retrying their searches")
    assert not results, "a request finished while node 2 was down"
    cluster.start_node(2, command=slow_index.command(cluster.python))
    for t in threads:
        t.join(timeout=60)
    assert [results[i].status_code for i in range(3)] == [200] * 3, [results[i].text for i in range(3)]
    assert time.monotonic() - started < REQUEST_TIMEOUT_S


def test_slow_node_2_gives_504_and_the_cluster_serves_normally_afterwards(cluster, slow_index):
    ids = [uid(f"slow-{i}") for i in range(3)]
    with slow_index.delayed(REQUEST_TIMEOUT_S * 1000 + 5000):
        started = time.monotonic()
        with ThreadPoolExecutor(3) as pool:
            responses = list(pool.map(lambda request_id: post_query(cluster, request_id), ids))
        elapsed = time.monotonic() - started
    for r in responses:
        assert r.status_code == 504 and r.json() == {"error": "Request timeout"}
    assert REQUEST_TIMEOUT_S - 1 < elapsed < REQUEST_TIMEOUT_S + 5
    # A timed-out id is not cached: sent again once node 2 is quick, it is computed.
    assert post_query(cluster, ids[0]).status_code == 200
    assert [post_query(cluster, uid(f"fast-{i}")).status_code for i in range(4)] == [200] * 4


# ---------------------------------------------------------------- a request_id is bound to its query

def test_a_completed_request_id_sent_with_another_query_gets_409_naming_the_query(cluster):
    request_id = uid("bound")
    first = post_query(cluster, request_id, "What is your refund policy?")
    assert first.status_code == 200
    again = post_query(cluster, request_id, "What is your refund policy?")
    assert again.text == first.text  # the same id and query: the id's own answer
    for other in ("How do I update my billing information?", "what is your refund policy?"):
        planted = post_query(cluster, request_id, other)  # exact text: case counts
        assert planted.status_code == 409, planted.text[:300]
        assert planted.json()["field"] == "query" and "request_id" in planted.json()["error"]
    assert post_query(cluster, request_id, "What is your refund policy?").text == first.text


def gateway_stats(cluster) -> dict:
    return health(cluster, 0)["gateway"]


def test_a_joiner_with_another_query_gets_409_not_the_other_querys_answer(cluster, slow_index):
    request_id = uid("bound-flight")
    with ThreadPoolExecutor(2) as pool:
        with slow_index.held():  # the first asker stays in flight until its joiner has joined
            owner = pool.submit(post_query, cluster, request_id, "Where is my order?")
            wait_until(lambda: gateway_stats(cluster)["in_flight"] == 1, 3, "the first asker is not in flight")
            started = time.monotonic()
            planted = post_query(cluster, request_id, "What payment methods do you accept?")
            assert planted.status_code == 409, planted.text[:300]
            assert planted.json()["field"] == "query" and time.monotonic() - started < 2
            joined = gateway_stats(cluster)["joined"]
            joiner = pool.submit(post_query, cluster, request_id, "Where is my order?")
            wait_until(lambda: gateway_stats(cluster)["joined"] == joined + 1, 4, "the joiner is not counted")
        assert owner.result(timeout=30).status_code == 200
        assert joiner.result(timeout=30).text == owner.result().text


# ---------------------------------------------------------------- joiners are bounded

def test_joiners_beyond_their_caps_get_an_immediate_503_while_health_stays_quick(cluster, slow_index):
    ids, query = [uid("join-a"), uid("join-b")], "How long does shipping typically take?"
    with ThreadPoolExecutor(2 + MAX_JOINERS) as pool:
        with slow_index.held():  # both ids stay in flight until every joiner is counted or refused
            owners = [pool.submit(post_query, cluster, request_id, query) for request_id in ids]
            wait_until(lambda: gateway_stats(cluster)["in_flight"] == 2, 3, "the two ids are not in flight")
            joined = gateway_stats(cluster)["joined"]
            accepted = join(pool, cluster, ids[0], MAX_JOINERS_PER_ID, joined)
            assert_refused(cluster, ids[0], "per request_id")
            accepted += join(pool, cluster, ids[1], MAX_JOINERS - MAX_JOINERS_PER_ID, joined + MAX_JOINERS_PER_ID)
            assert_refused(cluster, ids[1], "in all")
            started = time.monotonic()
            assert health(cluster, 0)["status"] == "healthy" and time.monotonic() - started < 1
        replies = [f.result(timeout=30) for f in owners + accepted]
    assert [r.status_code for r in replies] == [200] * len(replies)
    stats = gateway_stats(cluster)
    assert stats["joined"] - joined == MAX_JOINERS and stats["rejected_joiners"] >= 6


def assert_refused(cluster, request_id: str, cap: str) -> None:
    """Three more callers of request_id: each refused at once (503 + Retry-After) by the named cap."""
    for _ in range(3):
        r = post_query(cluster, request_id, "How long does shipping typically take?", timeout=30)
        assert_json_answer(r, {503})
        assert r.elapsed.total_seconds() < 1 and cap in r.json()["error"], r.text[:300]


def join(pool, cluster, request_id: str, n: int, joined_before: int) -> list:
    """n callers joining request_id, returned once the gateway counts them all as joined."""
    futures = [pool.submit(post_query, cluster, request_id, "How long does shipping typically take?")
               for _ in range(n)]
    wait_until(lambda: gateway_stats(cluster)["joined"] >= joined_before + n, 4, f"{n} joiners not counted")
    return futures


# ---------------------------------------------------------------- the reply cache stays behind the request_id

def test_with_the_reply_cache_on_a_request_id_keeps_its_own_answer(cluster, tmp_path):
    # A node 0 of its own with the reply cache on: the module's keeps it off, which the other tests need.
    with second_gateway(cluster, tmp_path / "logs", RESPONSE_CACHE_SIZE="64") as gateway:
        first_id, other_id = uid("own"), uid("own-other")
        first = post_query(gateway, first_id, "Is there a warranty on electronic items?")
        assert first.status_code == 200
        hits = idempotency_hits(gateway)
        again = post_query(gateway, first_id, "Is there a warranty on electronic items?")
        assert again.text == first.text  # not the reply cache's copy (marked "cached", re-addressed)
        assert idempotency_hits(gateway) == hits + 1
        assert post_query(gateway, other_id, "What is your refund policy?").status_code == 200
        planted = post_query(gateway, first_id, "What is your refund policy?")  # a hit in the reply cache
        assert planted.status_code == 409 and planted.json()["field"] == "query", planted.text[:300]
        assert gateway.procs[0].poll() is None, gateway.tail(0)


def fill_the_gateway(cluster, tag: str) -> tuple[list[threading.Thread], dict]:
    """MAX_IN_FLIGHT queries sent on their own threads, returned once node 0 holds them all in flight;
    their responses land in the dict by index."""
    tag, results = uid(tag), {}

    def send(i):
        results[i] = post_query(cluster, f"{tag}-{i}", spec.REFERENCE_QUERIES[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(MAX_IN_FLIGHT)]
    for t in threads:
        t.start()
    wait_until(lambda: health(cluster, 0)["gateway"]["in_flight"] == MAX_IN_FLIGHT, 5, "requests not in flight")
    return threads, results


def test_embeddings_are_counted_against_the_gateways_admission(cluster, slow_index):
    embed = {"model": spec.EMBEDDER_MODEL, "input": "Where is my parcel?"}
    with slow_index.held():  # the queries stay in flight, filling the gateway, until the check is done
        threads, results = fill_the_gateway(cluster, "admit")
        rejected = health(cluster, 0)["gateway"]["rejected"]
        full = requests.post(f"{cluster.url(0)}/v1/embeddings", json=embed, timeout=10)
        assert full.status_code == 503 and "capacity" in full.json()["error"]["message"], full.text[:300]
        assert full.headers["x-should-retry"] == "true" and int(full.headers["Retry-After"]) >= 1
        assert health(cluster, 0)["gateway"]["rejected"] == rejected + 1
    for t in threads:
        t.join(timeout=60)
    assert [results[i].status_code for i in range(MAX_IN_FLIGHT)] == [200] * MAX_IN_FLIGHT
    assert requests.post(f"{cluster.url(0)}/v1/embeddings", json=embed, timeout=30).status_code == 200


# ---------------------------------------------------------------- SIGTERM (stops node 0: last)

def test_sigterm_drains_node_0_then_exits_0(cluster, slow_index, request):
    with slow_index.held():  # the requests stay in flight until node 0 has refused new work
        threads, results = fill_the_gateway(cluster, "drain")
        request.node.stopped_nodes = {0}
        node0 = cluster.procs[0]
        node0.send_signal(signal.SIGTERM)
        wait_until(lambda: health(cluster, 0)["status"] == "stopping", 10, "node 0 is not draining")
        late = post_query(cluster, uid("late"), timeout=10)  # stopping: new work is refused
        assert_json_answer(late, {503})
    for t in threads:
        t.join(timeout=60)
    assert [results[i].status_code for i in range(MAX_IN_FLIGHT)] == [200] * MAX_IN_FLIGHT
    assert node0.wait(timeout=30) == 0
    with pytest.raises(requests.ConnectionError):
        post_query(cluster, uid("gone"), timeout=5)
    assert cluster.procs[1].poll() is None and cluster.procs[2].poll() is None
