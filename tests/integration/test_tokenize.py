"""vLLM's /tokenize and /detokenize on node 0 of the real three-node cluster on 127.0.0.1 (the shared
one): a text round-trips, a chat of the service's own prompt counts the tokens the service's prompt
had (a streamed /query's usage, its passages fetched by its sources), and bad input is a 400 in
OpenAI's shape naming the field."""
from __future__ import annotations

import pytest
import requests

from pipeline import spec
from pipeline.docstore import DocumentStore
from tests.helpers import uid
from tests.integration.test_streaming import stream_query

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def cluster(shared_cluster):
    return shared_cluster


def post(cluster, path: str, body: dict) -> requests.Response:
    return requests.post(f"{cluster.url(0)}{path}", json=body, timeout=60)


def test_tokenize_then_detokenize_round_trips_a_text(cluster):
    text = "My order hasn't arrived <|im_end|> ünïcödé 😀"
    r = post(cluster, "/tokenize", {"model": spec.GENERATOR_MODEL, "prompt": text})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0 and body["token_strs"] is None
    assert isinstance(body["max_model_len"], int)
    back = post(cluster, "/detokenize", {"model": spec.GENERATOR_MODEL, "tokens": body["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": text}


def test_a_chat_of_the_services_prompt_counts_the_tokens_its_answer_was_prompted_with(cluster, support_data):
    query = spec.REFERENCE_QUERIES[1]
    _pieces, reply = stream_query(cluster.url(0), uid("tok"), query)
    with DocumentStore(support_data.db_path) as store:
        documents = store.fetch(reply["sources"])
    messages = spec.build_messages(query, documents)
    r = post(cluster, "/tokenize", {"messages": list(messages)})
    assert r.status_code == 200, r.text
    assert r.json()["count"] == reply["usage"]["prompt_tokens"]
    rendered = post(cluster, "/detokenize", {"tokens": r.json()["tokens"]}).json()["prompt"]
    assert rendered.startswith("<|im_start|>system\n" + spec.SYSTEM_PROMPT) and query in rendered
    assert rendered.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("path,body,param", [
    ("/tokenize", {"prompt": "hi", "add_generation_prompt": "x", "bogus": 1}, "add_generation_prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
    ("/detokenize", {"tokens": [1, "two"]}, "tokens[1]"),
])
def test_bad_input_is_a_400_naming_the_field(cluster, path, body, param):
    r = post(cluster, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    assert r.headers["x-should-retry"] == "false"
