"""Streaming answers and the OpenAI-compatible API on a real three-node cluster (127.0.0.1, the shared one): the
streamed text equals the plain reply and the reference's, through node 0's own worker and relayed
from node 1; the real `openai` package as the client; a reader that disconnects frees its slot."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests

from pipeline import spec
from profiling.lib.prometheus import scrape
from services.server import sse
from tests.helpers import uid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def cluster(shared_cluster):
    return shared_cluster


def stream_query(url: str, request_id: str, query: str) -> tuple[list[str], dict]:
    """The /query stream read as it comes: its text pieces and its reply."""
    with requests.post(f"{url}/query", json={"request_id": request_id, "query": query, "stream": True},
                       stream=True, timeout=180) as response:
        assert response.status_code == 200, response.text[:300]
        assert response.headers["Content-Type"].startswith("text/event-stream")
        pieces, reply = [], None
        for event in sse.iter_events(sse.iter_lines(response.iter_content(chunk_size=None))):
            assert event.name in ("token", "reply"), event
            if event.name == "token":
                pieces.append(event.json()["text"])
            else:
                reply = event.json()
    assert reply is not None
    return pieces, reply


def test_streamed_pieces_join_to_the_plain_reply_and_the_references_on_both_workers(cluster, reference_answer):
    url, queries, prefix = cluster.url(0), list(spec.REFERENCE_QUERIES[:6]), uid("st")
    with ThreadPoolExecutor(len(queries)) as pool:  # concurrent: the pieces come from shared decode steps
        streamed = list(pool.map(lambda iq: stream_query(url, f"{prefix}-{iq[0]}", iq[1]), enumerate(queries)))
    assert {reply["served_by"] for _, reply in streamed} == {0, 1}  # node 1's streams relayed by node 0
    for i, (query, (pieces, reply)) in enumerate(zip(queries, streamed)):
        expected = reference_answer(query, f"{prefix}-{i}")
        assert len(pieces) > 1 and "".join(pieces) == reply["generated_response"] == expected["generated_response"]
        assert {k: reply[k] for k in expected} == expected
        assert reply["usage"]["completion_tokens"] >= len(pieces) and reply["finish_reason"] in ("stop", "length")
        plain = requests.post(f"{url}/query", json={"request_id": uid(f"pl{i}"), "query": query}, timeout=180).json()
        assert plain["generated_response"] == reply["generated_response"]
        assert "usage" not in plain  # without stream the reply is the contract's


def test_the_openai_package_gets_the_rag_answer_plain_and_streamed(cluster, reference_answer, reference):
    client = openai.OpenAI(base_url=f"{cluster.url(0)}/v1", api_key="not-checked", max_retries=0, timeout=180)
    assert [m.id for m in client.models.list()] == [spec.GENERATOR_MODEL, spec.EMBEDDER_MODEL, spec.RERANKER_MODEL,
                                                    spec.TOXICITY_MODEL]  # chat, embeddings, rerank, moderations
    query = spec.REFERENCE_QUERIES[1]
    expected = reference_answer(query)["generated_response"]
    # The contract's own system message asks for nothing else: the answer is the contract's.
    completion = client.chat.completions.create(model=spec.GENERATOR_MODEL,
                                                messages=[{"role": "system", "content": spec.SYSTEM_PROMPT},
                                                          {"role": "user", "content": query}])
    assert completion.choices[0].message.content == expected
    assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
    stream = client.chat.completions.create(model=spec.GENERATOR_MODEL, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": query}])
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage.completion_tokens == completion.usage.completion_tokens
    short = client.chat.completions.create(model=spec.GENERATOR_MODEL, max_tokens=4,
                                           messages=[{"role": "user", "content": query}])
    assert short.usage.completion_tokens <= 4 and expected.startswith(short.choices[0].message.content)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=spec.GENERATOR_MODEL, n=9, messages=[{"role": "user", "content": query}])
    assert refused.value.body["param"] == "n"
    # Another system message is added to the service's own, not refused: the oracle's answer with it.
    from pipeline.conversation import Conversation
    brief = client.chat.completions.create(model=spec.GENERATOR_MODEL, messages=[{"role": "system", "content": "be brief"},
                                                                                 {"role": "user", "content": query}])
    assert brief.choices[0].message.content == reference.completion(
        query, conversation=Conversation(instructions="be brief")).text


def generate_counts(url: str) -> tuple[float, float, float]:
    """(running sequences, decode steps, cancelled sequences) of a node's generate stage."""
    snapshot = scrape(f"{url}/metrics")
    assert not snapshot.error, snapshot.error
    return tuple(snapshot.get(name, stage="generate") or 0.0 for name in (  # type: ignore[return-value]
        "rag_generate_running_sequences", "rag_generate_decode_steps_total", "rag_generate_cancelled_sequences_total"))


def test_a_reader_that_disconnects_mid_answer_frees_its_slot_and_others_are_unaffected(cluster, reference_answer):
    url = cluster.url(0)
    # The whole answer's decode steps: a reader gone after its first token is freed before they have run (how many
    # run before a node hears of the disconnect depends on the machine's load, not on the service: at most 18
    # of these 51 seen on a loaded 2-vCPU machine).
    _, whole = stream_query(url, uid("whole"), spec.REFERENCE_QUERIES[2])
    steps_of_whole_answer = whole["usage"]["completion_tokens"] - 1
    assert steps_of_whole_answer >= 32, whole["usage"]  # room to tell a cancelled answer from a finished one
    for _ in range(2):  # round robin: one on node 0's own worker, one relayed from node 1
        before = {n: generate_counts(cluster.url(n)) for n in (0, 1)}
        response = requests.post(f"{url}/query", json={"request_id": uid("gone"), "stream": True,
                                                       "query": spec.REFERENCE_QUERIES[2]}, stream=True, timeout=180)
        lines = sse.iter_lines(response.iter_content(chunk_size=None))
        first = next(sse.iter_events(lines))
        assert first.name == "token"
        response.close()  # the reader is gone mid-answer
        deadline = time.monotonic() + 30
        while True:
            now = {n: generate_counts(cluster.url(n)) for n in (0, 1)}
            cancelled = [n for n in (0, 1) if now[n][2] > before[n][2]]
            if cancelled and now[cancelled[0]][0] == 0:
                break
            assert time.monotonic() < deadline, f"the slot was not freed: {now}"
            time.sleep(0.05)
        node = cancelled[0]
        steps_after_first_token = now[node][1] - before[node][1]
        assert steps_after_first_token < steps_of_whole_answer, (
            f"freed only after {steps_after_first_token} of the answer's {steps_of_whole_answer} decode steps")
    query = spec.REFERENCE_QUERIES[3]
    after = requests.post(f"{url}/query", json={"request_id": uid("after"), "query": query}, timeout=180)
    assert after.status_code == 200 and after.json()["generated_response"] == reference_answer(query)["generated_response"]
