"""The clients front-ends use, at their usual arguments, against a real three-node cluster on
127.0.0.1: the `openai` package (chat and completions plain and streamed with temperature, seed,
stop and max_tokens; embeddings; what is refused rather than ignored; each error status as its SDK
exception), `langchain-openai` (ChatOpenAI invoke and stream, OpenAIEmbeddings) and `litellm`; every
client body kept in tests/fixtures/client_requests/ (Open WebUI's included) sent as it is; and two
keys' request ids kept apart.

Two shared clusters (tests/support/shared_cluster.py): what needs API keys and CORS runs on
KEYED_CACHE (the load generator, which the plain cluster also serves, sends no key), the rest on the
plain one, which ignores the key the clients send."""
from __future__ import annotations

import base64
import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
import requests

from pipeline import spec
from tests.helpers import uid
from tests.support.client_requests import FIXTURES
from tests.support.shared_cluster import KEY, ORIGIN, OTHER_KEY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CHAT_MODEL, EMBED_MODEL = spec.GENERATOR_MODEL, spec.EMBEDDER_MODEL
QUESTION = spec.REFERENCE_QUERIES[0]
USER = [{"role": "user", "content": QUESTION}]


@pytest.fixture
def cluster(shared_cluster):
    return shared_cluster


@pytest.fixture
def keyed(keyed_cache_cluster):
    """The cluster with API keys (KEY and OTHER_KEY), CORS for ORIGIN and a 4096-byte body limit."""
    return keyed_cache_cluster


def sdk(cluster, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url(0)}/v1", api_key=key, max_retries=0, timeout=300)


@pytest.fixture
def client(cluster) -> openai.OpenAI:
    return sdk(cluster)


@pytest.fixture
def keyed_client(keyed) -> openai.OpenAI:
    return sdk(keyed)


def chat(client: openai.OpenAI, **kwargs):
    return client.chat.completions.create(model=CHAT_MODEL, messages=USER, **kwargs)


def streamed(client: openai.OpenAI, **kwargs) -> tuple[str, str | None]:
    pieces, reason = [], None
    for chunk in chat(client, stream=True, **kwargs):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            reason = chunk.choices[0].finish_reason or reason
    return "".join(pieces), reason


# ---------------------------------------------------------------- openai

def test_the_same_seed_gives_the_same_sampled_answer_plain_streamed_and_among_8(client):
    sampled = {"temperature": 0.9, "top_p": 0.95, "seed": 1234, "max_tokens": 48}
    alone = chat(client, **sampled)
    text = alone.choices[0].message.content
    assert text and alone.model_extra["seed"] == 1234
    assert streamed(client, **sampled)[0] == text
    greedy = chat(client, max_tokens=48).choices[0].message.content
    assert greedy != text  # it did sample
    others = [{**sampled, "seed": seed} for seed in range(7)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda kw: chat(client, **kw).choices[0].message.content, [sampled, *others]))
    assert answers[0] == text
    drawn = chat(client, temperature=0.7, max_tokens=16)
    again = chat(client, temperature=0.7, max_tokens=16, seed=drawn.model_extra["seed"])
    assert again.choices[0].message.content == drawn.choices[0].message.content


def test_stop_strings_end_the_answer_and_are_not_returned(client):
    full = chat(client, max_tokens=64).choices[0].message.content
    assert len(full) > 12, full
    stop = full[len(full) // 2: len(full) // 2 + 4]
    plain = chat(client, max_tokens=64, stop=[stop, "never-there"])
    assert plain.choices[0].message.content == full[:full.index(stop)]
    assert plain.choices[0].finish_reason == "stop"
    assert streamed(client, max_tokens=64, stop=stop) == (full[:full.index(stop)], "stop")


def test_max_tokens_up_to_the_cap_and_finish_reason_length(client):
    short = chat(client, max_tokens=5)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 5
    assert streamed(client, max_tokens=5)[1] == "length"
    long = chat(client, max_tokens=4096)  # over OPENAI_MAX_TOKENS_CAP: clamped, not refused
    assert long.usage.completion_tokens <= 512
    assert long.choices[0].finish_reason == ("length" if long.usage.completion_tokens == 512 else "stop")


def test_completions_plain_and_streamed_are_the_chats_rag_answer(client):
    greedy = chat(client, max_tokens=24).choices[0].message.content
    plain = client.completions.create(model=CHAT_MODEL, prompt=QUESTION, max_tokens=24)
    assert plain.object == "text_completion" and plain.choices[0].text == greedy  # the same question, prompt, decoding
    assert plain.usage.completion_tokens <= 24 and plain.usage.prompt_tokens > 0
    pieces, reason = [], None
    for chunk in client.completions.create(model=CHAT_MODEL, prompt=QUESTION, max_tokens=24, stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            reason = chunk.choices[0].finish_reason or reason
    assert "".join(pieces) == greedy and reason == plain.choices[0].finish_reason
    short = client.completions.create(model=CHAT_MODEL, prompt=QUESTION, max_tokens=5)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 5
    sampled = {"temperature": 0.9, "seed": 77, "max_tokens": 24}
    once = client.completions.create(model=CHAT_MODEL, prompt=QUESTION, **sampled)
    assert once.model_extra["seed"] == 77
    assert client.completions.create(model=CHAT_MODEL, prompt=QUESTION, **sampled).choices[0].text == \
        once.choices[0].text
    stop = greedy[len(greedy) // 2: len(greedy) // 2 + 3]
    stopped = client.completions.create(model=CHAT_MODEL, prompt=QUESTION, max_tokens=24, stop=[stop])
    assert stopped.choices[0].text == greedy[:greedy.index(stop)]


def test_what_the_service_would_not_act_on_is_refused_naming_it(client):
    for kwargs, param in (({"extra_body": {"min_p": 0.1}}, "min_p"), ({"logit_bias": {"42": 5}}, "logit_bias"),
                          ({"extra_body": {"guided_json": {"type": "object"}}}, "guided_json"),
                          ({"extra_body": {"no_such_field": 1}}, "no_such_field")):
        with pytest.raises(openai.BadRequestError) as refused:
            chat(client, **kwargs)
        assert refused.value.param == param
    with pytest.raises(openai.BadRequestError) as tool:  # greedy decoding cannot force a call
        chat(client, tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="required")
    assert tool.value.param == "tool_choice"
    with pytest.raises(openai.BadRequestError) as text:
        client.completions.create(model=CHAT_MODEL, prompt=QUESTION, extra_body={"repetition_penalty": 1.2})
    assert text.value.param == "repetition_penalty"
    contract = [{"role": "system", "content": spec.SYSTEM_PROMPT}, *USER]  # the prompt's own: accepted
    assert client.chat.completions.create(model=CHAT_MODEL, messages=contract, max_tokens=4, user="u-1").choices


INSTRUCTIONS = "Answer in one sentence."
# Five user turns, two of them short follow-ups (retrieval reads the turn before them too).
TURNS = ("My order hasn't arrived yet, tracking number is ABC123", "and to Canada?",
         "How do I return a defective product?", "What is your refund policy?", "and for electronics?")


def chat_turn(client: openai.OpenAI, messages: list[dict], stream: bool) -> tuple[str, dict]:
    """The assistant's answer to the conversation so far, and its usage."""
    if not stream:
        reply = client.chat.completions.create(model=CHAT_MODEL, messages=messages)
        assert reply.usage is not None
        return reply.choices[0].message.content or "", reply.usage.model_dump()
    pieces, usage = [], None
    for chunk in client.chat.completions.create(model=CHAT_MODEL, messages=messages, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    assert usage is not None
    return "".join(pieces), usage


def test_the_sdks_chat_loop_holds_a_five_turn_conversation_streamed_and_not(client, reference):
    """The SDK's chat loop: each answer appended to the history, the next question after it. Each
    answer is the reference pipeline's to the same conversation (its instructions, its earlier turns,
    its follow-up retrieval), streamed or not; the same conversation alone and among seven other
    conversations at once gets the same answer."""
    from pipeline.conversation import Conversation, Turn
    transcripts = []
    for stream in (False, True):
        messages: list[dict] = [{"role": "system", "content": INSTRUCTIONS}]
        for question in TURNS:
            messages.append({"role": "user", "content": question})
            text, usage = chat_turn(client, messages, stream)
            history = tuple(Turn(m["role"], m["content"]) for m in messages[1:-1])
            assert text == reference.completion(question, conversation=Conversation(history, INSTRUCTIONS)).text
            assert usage.get("history_turns_dropped") == (0 if history else None)
            messages.append({"role": "assistant", "content": text})
        transcripts.append(messages)
    assert transcripts[0] == transcripts[1]
    last = transcripts[0][:-1]
    others = [[{"role": "system", "content": INSTRUCTIONS}, *last[1 + 2 * i:]] for i in range(1, 5)] + \
        [[m for m in last if m["role"] != "system"], *([{"role": "user", "content": q}] for q in TURNS[2:4])]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda messages: chat_turn(client, messages, False)[0], [last, *others]))
    assert answers[0] == transcripts[0][-1]["content"]


def test_langchain_holds_a_conversation_as_the_sdk_does(client, cluster):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(model=CHAT_MODEL, base_url=f"{cluster.url(0)}/v1", api_key=KEY, temperature=0, max_retries=0,
                     timeout=300, metadata={"conversation": "c-1"})
    first = llm.invoke([SystemMessage(INSTRUCTIONS), HumanMessage(TURNS[0])])
    history = [SystemMessage(INSTRUCTIONS), HumanMessage(TURNS[0]), AIMessage(first.content), HumanMessage(TURNS[1])]
    answer = llm.invoke(history)
    sdk_messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": TURNS[0]},
                    {"role": "assistant", "content": first.content}, {"role": "user", "content": TURNS[1]}]
    assert answer.content == chat_turn(client, sdk_messages, False)[0]
    assert "".join(str(chunk.content) for chunk in llm.stream(history)) == answer.content


def test_embeddings_float_and_base64(client):
    floats = client.embeddings.create(model=EMBED_MODEL, input=[QUESTION, "refund policy"])
    assert [len(d.embedding) for d in floats.data] == [spec.EMBED_DIM] * 2 and floats.usage.prompt_tokens > 0
    vector = np.array(floats.data[0].embedding, dtype=np.float32)
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-3
    raw = client.embeddings.with_raw_response.create(model=EMBED_MODEL, input=QUESTION, encoding_format="base64")
    packed = np.frombuffer(base64.b64decode(raw.http_response.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(packed, vector)


def test_each_error_status_is_its_sdk_exception(keyed, keyed_client):
    client, reused = keyed_client, uid("reused-id")
    with pytest.raises(openai.BadRequestError) as bad:
        chat(client, presence_penalty=0.5)
    assert bad.value.param == "presence_penalty"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{keyed.url(0)}/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    assert client.models.retrieve(CHAT_MODEL).id == CHAT_MODEL
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="q")
    chat(client, max_tokens=4, extra_body={"request_id": reused})
    with pytest.raises(openai.ConflictError) as conflict:
        client.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "another"}],
                                       max_tokens=4, extra_body={"request_id": reused})
    assert conflict.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.APIStatusError) as too_large:
        chat(client, extra_body={"padding": "x" * 5000})
    assert too_large.value.status_code == 413 and too_large.value.body["code"] == "request_too_large"
    with pytest.raises(openai.APIStatusError) as not_allowed:
        client.get("/chat/completions", cast_to=object)
    assert not_allowed.value.status_code == 405


def test_keys_guard_the_public_paths_and_cors_answers_a_browser(keyed):
    url = keyed.url(0)
    assert requests.post(f"{url}/query", json={"request_id": uid("k"), "query": QUESTION}, timeout=60).status_code == 401
    assert requests.get(f"{url}/health", timeout=10).status_code == 200
    preflight = requests.options(f"{url}/v1/chat/completions", timeout=10, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 204 and preflight.headers["Access-Control-Allow-Origin"] == ORIGIN
    models = requests.get(f"{url}/v1/models", headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"}, timeout=10)
    assert models.headers["Access-Control-Allow-Origin"] == ORIGIN


def test_neither_key_can_detect_nor_replay_the_others_request_id(keyed, keyed_client):
    """A request_id is its key's: the other key reusing it gets no 409 (it cannot tell the id was
    used) and no replay (its answer is computed for it, with another drawn seed); each key still
    gets its own replays and its own 409s."""
    client, other = keyed_client, sdk(keyed, OTHER_KEY)
    scoped_1, scoped_2, scoped_q = uid("scoped-1"), uid("scoped-2"), uid("scoped-q")

    def ask(sdk: openai.OpenAI, request_id: str, question: str = QUESTION, **fields):
        return sdk.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": question}],
                                           **{"temperature": 0.9, "max_tokens": 8, **fields},
                                           extra_body={"request_id": request_id})

    mine = ask(client, scoped_1)
    assert ask(other, scoped_1, "Do you ship to Norway?").choices[0].message.content is not None  # no 409
    url = keyed.url(0)
    for key, question in ((KEY, QUESTION), (OTHER_KEY, "Do you ship to Norway?")):  # no 409 on /query either
        answered = requests.post(f"{url}/query", json={"request_id": scoped_q, "query": question},
                                 headers={"Authorization": f"Bearer {key}"}, timeout=300)
        assert answered.status_code == 200 and answered.json()["request_id"] == scoped_q
    original = ask(client, scoped_2)
    copy = ask(other, scoped_2)  # the very same request: computed for this key, not replayed
    assert copy.model_extra["seed"] != original.model_extra["seed"]
    assert ask(client, scoped_1).model_extra["seed"] == mine.model_extra["seed"]
    assert ask(client, scoped_2).model_extra["seed"] == original.model_extra["seed"]
    assert ask(other, scoped_2).model_extra["seed"] == copy.model_extra["seed"]
    with pytest.raises(openai.ConflictError):
        ask(client, scoped_1, max_tokens=9)
    with pytest.raises(openai.ConflictError):
        ask(other, scoped_1)  # its scoped_1 is its Norway question


# ---------------------------------------------------------------- langchain-openai

@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda path: path.stem)
def test_each_client_body_kept_as_a_fixture_is_answered(cluster, path):
    recorded = json.loads(path.read_text())
    body = recorded["body"]
    with requests.post(f"{cluster.url(0)}{recorded['path']}", json=body, stream=bool(body.get("stream")),
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=300) as response:
        assert response.status_code == 200, response.text
        if not body.get("stream"):
            choice = response.json()["choices"][0]
            assert choice["message"]["content"] and choice["finish_reason"] in ("stop", "length")
            return
        events = [line.removeprefix("data: ") for line in response.iter_lines(decode_unicode=True)
                  if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    if (body.get("stream_options") or {}).get("include_usage"):  # a usage chunk, with no choice, closes it
        *chunks, usage = chunks
        assert usage["usage"]["completion_tokens"] > 0 and not usage["choices"]
    assert all(c["choices"] for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_langchain_chat_openai_invoke_and_stream(cluster):
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(model=CHAT_MODEL, base_url=f"{cluster.url(0)}/v1", api_key=KEY, temperature=0.7,
                     max_tokens=512, seed=42, max_retries=0, timeout=300)
    message = llm.invoke(QUESTION)
    assert message.content and message.response_metadata["finish_reason"] in ("stop", "length")
    assert "".join(chunk.content for chunk in llm.stream(QUESTION)) == message.content  # same seed


def test_langchain_openai_embeddings(cluster):
    from langchain_openai import OpenAIEmbeddings
    # check_embedding_ctx_length=False: send text, not OpenAI's token ids (docs/api.md)
    embeddings = OpenAIEmbeddings(model=EMBED_MODEL, base_url=f"{cluster.url(0)}/v1", api_key=KEY,
                                  check_embedding_ctx_length=False, max_retries=0)
    query = embeddings.embed_query(QUESTION)
    documents = embeddings.embed_documents([QUESTION, "shipping times"])
    assert len(query) == spec.EMBED_DIM and np.allclose(query, documents[0], atol=1e-5)


# ---------------------------------------------------------------- litellm

def test_litellm_completion_stream_and_embedding(cluster):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of its price list
    import litellm
    base = {"api_base": f"{cluster.url(0)}/v1", "api_key": KEY}
    args = {"model": f"openai/{CHAT_MODEL}", "messages": USER, "temperature": 0.8, "seed": 9, "max_tokens": 32, **base}
    text = litellm.completion(**args).choices[0].message.content
    assert text
    assert "".join(c.choices[0].delta.content or "" for c in litellm.completion(stream=True, **args)) == text
    vectors = litellm.embedding(model=f"openai/{EMBED_MODEL}", input=[QUESTION], **base)
    assert len(vectors.data[0]["embedding"]) == spec.EMBED_DIM
