"""`n` and log probabilities with the `openai` package against the real three-node cluster on
127.0.0.1 (the shared one): choice i of a sampled request is the answer its seed + i gets alone;
a request's log probabilities are the same bits alone and among 7 others (on either worker), one
per answer token, streamed chunk by chunk with the tokens they belong to."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from pipeline import spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

QUESTION = [{"role": "user", "content": spec.REFERENCE_QUERIES[3]}]


@pytest.fixture
def client(shared_cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{shared_cluster.url(0)}/v1", api_key="not-checked", max_retries=0, timeout=300)


def test_choice_i_of_n_is_the_answer_its_seed_plus_i_gets_alone(client):
    ask = {"model": spec.GENERATOR_MODEL, "messages": QUESTION, "temperature": 0.9, "max_tokens": 12}
    several = client.chat.completions.create(n=3, seed=40, **ask)
    assert [c.index for c in several.choices] == [0, 1, 2]
    alone = [client.chat.completions.create(seed=40 + i, **ask) for i in range(3)]
    assert [c.message.content for c in several.choices] == [a.choices[0].message.content for a in alone]
    assert several.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert several.usage.prompt_tokens == alone[0].usage.prompt_tokens
    streamed = client.chat.completions.create(n=3, seed=40, stream=True, **ask)
    texts = ["", "", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in several.choices]


def test_log_probabilities_are_the_same_alone_and_among_7_others(client):
    ask = {"model": spec.GENERATOR_MODEL, "messages": QUESTION, "max_tokens": 10, "logprobs": True, "top_logprobs": 2}
    alone = client.chat.completions.create(**ask)
    content = alone.choices[0].logprobs.content
    assert len(content) == alone.usage.completion_tokens and all(len(c.top_logprobs) == 2 for c in content)
    others = [{**ask, "messages": [{"role": "user", "content": q}], "temperature": 0.5 + i / 10, "seed": i}
              for i, q in enumerate(spec.REFERENCE_QUERIES[:7])]
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda body: client.chat.completions.create(**body), [ask, *others]))
    assert replies[0].choices[0].logprobs.content == content
    carrying = []  # per stream: how many chunks carried log probabilities
    for _ in range(2):  # round robin: one node 0's own worker's, one relayed from node 1's
        chunks = [c for c in client.chat.completions.create(stream=True, **ask) if c.choices]
        streamed = [item for c in chunks if c.choices[0].logprobs for item in c.choices[0].logprobs.content]
        assert streamed == content  # every token's, once, in order
        carrying.append(sum(1 for c in chunks if c.choices[0].logprobs))
    assert min(carrying) > 1  # chunk by chunk on both workers, not all in the last one
