"""services/roles/gateway/openai_choices.py: `n` > 1 on /v1/chat/completions and /v1/completions over a
real Gateway, each choice its own request to the worker (its id, its seed: seed + i), run at once;
replies and streams with each choice indexed, usage summed (the prompt once), a choice's failure the
request's."""
from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline import spec
from services.roles.gateway.openai_choices import MAX_N, choice_requests
from services.roles.gateway.routing import WorkerTarget
from services.server.answer_request import AnswerRequest
from services.server.errors import StageFailed
from tests.unit.test_gateway import gateway
from tests.unit.test_gateway_role import query_app

pytestmark = pytest.mark.timeout(60)

MODEL = spec.GENERATOR_MODEL
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "How do I return it?"}]}


class SeedWorker:
    """Answers each request with words naming its seed; with `together`, no answer ends before all of
    them have started (so the choices must run at once)."""

    def __init__(self, together: int = 0, fail_seed: int | None = None):
        self.seen: list[AnswerRequest] = []
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(together, timeout=10) if together else None
        self.fail_seed = fail_seed

    def answer(self, request, deadline):
        with self.lock:
            self.seen.append(request)
        if self.barrier is not None:
            self.barrier.wait()
        if request.seed is not None and request.seed == self.fail_seed:
            raise StageFailed("generate", RuntimeError("boom"))
        words = ["seed", str(request.seed)]
        yield words[0]
        yield f" {words[1]}"
        yield {"request_id": request.request_id, "generated_response": " ".join(words), "sentiment": "neutral",
               "is_toxic": "false", "usage": {"prompt_tokens": 40, "completion_tokens": 2 + len(self.seen) % 1},
               "finish_reason": "stop", "served_by": 0, **({"seed": request.seed} if request.seed is not None else {})}


def app(worker: SeedWorker, **gateway_kwargs):
    role, client = query_app([])
    role.gateway.set(gateway(WorkerTarget(node=0, answer=worker.answer, probe=lambda: True, local=True),
                             **gateway_kwargs))
    return client


def test_n_choices_take_one_admission_slot_and_a_full_gateway_refuses_the_whole_request_once():
    worker = SeedWorker(together=3)
    client = app(worker, max_in_flight=1)
    r = client.post("/v1/chat/completions", json={**CHAT, "n": 3, "temperature": 0.8, "seed": 1})
    assert r.status_code == 200 and len(r.get_json()["choices"]) == 3, r.get_data(as_text=True)
    gate, started = threading.Event(), threading.Event()

    def held(request, deadline):  # one request holding the only slot until the gate opens
        started.set()
        assert gate.wait(10), "test gate never opened"
        yield from SeedWorker().answer(request, deadline)

    role, client = query_app([])
    role.gateway.set(gateway(WorkerTarget(node=0, answer=held, probe=lambda: True, local=True), max_in_flight=1))
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/v1/chat/completions", json=CHAT)
        assert started.wait(10)
        refused = client.post("/v1/chat/completions", json={**CHAT, "n": 2, "temperature": 0.5, "stream": True})
        assert refused.status_code == 503 and refused.get_json()["error"]["code"] == "service_unavailable"
        assert role.gateway.require().stats()["rejected"] == 1  # one refusal: the request's, not each choice's
        gate.set()
        assert first.result(10).status_code == 200
    assert role.gateway.require().stats()["in_flight"] == 0


def test_a_streamed_n_requests_completion_line_names_the_worker(caplog):
    import logging
    with caplog.at_level(logging.INFO, logger="services.requests"):
        r = app(SeedWorker()).post("/v1/chat/completions", json={**CHAT, "n": 2, "temperature": 0.5, "stream": True})
        assert r.status_code == 200 and r.get_data(as_text=True).endswith("data: [DONE]\n\n")
        r.close()  # as the server closes it once sent: the line is written then
    (line,) = [record.fields for record in caplog.records if record.name == "services.requests"]
    assert (line["endpoint"], line["status"], line["served_by"]) == ("/v1/chat/completions", 200, 0)


def test_n_choices_run_at_once_each_with_its_id_and_seed_plus_i_and_usage_summed():
    worker = SeedWorker(together=3)
    r = app(worker).post("/v1/chat/completions", json={**CHAT, "n": 3, "temperature": 0.8, "seed": 11,
                                                        "request_id": "nn"})
    assert r.status_code == 200, r.get_data(as_text=True)
    body = r.get_json()
    assert sorted((q.request_id, q.seed) for q in worker.seen) == [("nn-0", 11), ("nn-1", 12), ("nn-2", 13)]
    assert [(c["index"], c["message"]["content"]) for c in body["choices"]] == [(0, "seed 11"), (1, "seed 12"),
                                                                                (2, "seed 13")]
    assert body["usage"]["prompt_tokens"] == 40 and body["usage"]["completion_tokens"] == 6 and body["seed"] == 11


def test_a_sampled_request_without_a_seed_draws_one_for_all_its_choices_and_greedy_has_none():
    asked = AnswerRequest("r", "q", temperature=0.5)
    seeds = [c.seed for c in choice_requests(asked, 4)]
    assert seeds[0] is not None and seeds == [seeds[0] + i if seeds[0] + i < 2**63 else seeds[0] + i - 2**64
                                              for i in range(4)]
    assert [c.seed for c in choice_requests(AnswerRequest("r", "q"), 2)] == [None, None]
    top = AnswerRequest("r", "q", temperature=0.5, seed=2**63 - 1)
    assert [c.seed for c in choice_requests(top, 2)] == [2**63 - 1, -(2**63)]  # wrapped within 64 bits
    assert choice_requests(asked, 1) == [asked]


def test_streamed_choices_are_indexed_each_ends_with_its_finish_and_the_usage_is_summed():
    worker = SeedWorker(together=2)
    body = {**CHAT, "n": 2, "temperature": 0.8, "seed": 5, "stream": True, "stream_options": {"include_usage": True}}
    r = app(worker).post("/v1/chat/completions", json=body)
    events = [line[len("data: "):] for line in r.get_data(as_text=True).splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    *choice_chunks, usage = chunks
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4 and usage["usage"]["prompt_tokens"] == 40
    for i, seed in ((0, 5), (1, 6)):
        mine = [c["choices"][0] for c in choice_chunks if c["choices"][0]["index"] == i]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["delta"].get("content") or "" for c in mine) == f"seed {seed}"
        assert [c["finish_reason"] for c in mine][-1] == "stop" and sum(c["finish_reason"] is not None for c in mine) == 1


def test_text_completions_take_n_too():
    worker = SeedWorker()
    r = app(worker).post("/v1/completions", json={"model": MODEL, "prompt": "q", "n": 2, "temperature": 1.0, "seed": 1})
    assert [(c["index"], c["text"]) for c in r.get_json()["choices"]] == [(0, "seed 1"), (1, "seed 2")]
    streamed = app(SeedWorker()).post("/v1/completions", json={"model": MODEL, "prompt": "q", "n": 2, "temperature": 1.0,
                                                               "seed": 1, "stream": True})
    chunks = [json.loads(line[6:]) for line in streamed.get_data(as_text=True).splitlines()
              if line.startswith("data: {")]
    for i, seed in ((0, 1), (1, 2)):
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i) == f"seed {seed}"


def test_a_failing_choice_fails_the_request_and_n_is_bounded():
    r = app(SeedWorker(fail_seed=8)).post("/v1/chat/completions", json={**CHAT, "n": 2, "temperature": 0.5, "seed": 7})
    assert r.status_code >= 500 and r.get_json()["error"]["message"]
    for n in (0, MAX_N + 1, 1.5, True):
        bad = app(SeedWorker()).post("/v1/chat/completions", json={**CHAT, "n": n})
        assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "n"
