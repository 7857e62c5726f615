"""Node 0's public API beyond its routes (services/roles/gateway/public_api.py): OpenAI-shaped /v1
errors with x-should-retry, API keys, CORS, /v1/models/{id}, /openapi.json against the routes that
exist, the /v1 sampling fields reaching the worker, and /v1/embeddings' request and response."""
from __future__ import annotations

import base64
import hashlib
import re

import numpy as np
import pytest

from pipeline import spec
from services.roles.gateway.openai_embeddings import EmbedderModel, embeddings_response, parse_embeddings_request
from services.roles.gateway.public_api import openapi_document
from services.roles.gateway.routing import WorkerTarget
from services.server.errors import ApiError, Overloaded
from tests.unit.test_gateway import gateway
from tests.unit.test_gateway_role import Outcomes, query_app

MODEL = spec.GENERATOR_MODEL
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "How do I return it?"}]}
REPLY = {"generated_response": "Returns take 30 days.", "sentiment": "neutral", "is_toxic": "false"}


def openai_error(response, status: int, retry: bool) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.headers["x-should-retry"] == ("true" if retry else "false")
    error = response.get_json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


# ---------------------------------------------------------------- errors

def test_every_v1_error_is_in_openais_shape_with_x_should_retry():
    _role, client = query_app([], MAX_BODY_BYTES="1024")
    assert openai_error(client.get("/v1/nothing-here"), 404, False)["code"] == "not_found"
    openai_error(client.get("/v1/chat/completions"), 405, False)
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
    assert openai_error(client.post("/v1/chat/completions", json=big), 413, False)["code"] == "request_too_large"
    assert openai_error(client.post("/v1/chat/completions", json={**CHAT, "n": 99}), 400, False)["param"] == "n"
    assert openai_error(client.get("/v1/models/gpt-4o"), 404, False)["code"] == "model_not_found"
    # the rest of the node keeps its own shape
    assert client.get("/nothing-here").get_json()["error"] and "x-should-retry" not in client.get("/nothing").headers


def test_a_full_gateway_is_a_retryable_503_and_a_reused_request_id_a_final_409():
    role, client = query_app([Overloaded("full", retry_after_s=2.0), REPLY])
    response = client.post("/v1/chat/completions", json=CHAT)
    assert openai_error(response, 503, True)["type"] == "server_error" and response.headers["Retry-After"] == "2"
    assert client.post("/v1/chat/completions", json={**CHAT, "request_id": "same"}).status_code == 200
    other = {**CHAT, "request_id": "same", "messages": [{"role": "user", "content": "another question"}]}
    assert openai_error(client.post("/v1/chat/completions", json=other), 409, False)["code"] == "conflict"


def test_models_and_one_model_by_id():
    _role, client = query_app([])
    ids = [m["id"] for m in client.get("/v1/models").get_json()["data"]]
    assert ids == [MODEL, spec.EMBEDDER_MODEL, spec.RERANKER_MODEL, spec.TOXICITY_MODEL]
    for model_id in ids:
        assert client.get(f"/v1/models/{model_id}").get_json()["id"] == model_id


# ---------------------------------------------------------------- API keys and CORS

@pytest.fixture()
def keys_file(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# keys\nplain-key-1\n\nsha256:{hashlib.sha256(b'hashed-key-2').hexdigest()}\n")
    return path


def test_with_keys_the_public_paths_need_a_valid_bearer_key_and_health_stays_open(keys_file, caplog):
    _role, client = query_app([REPLY, REPLY, REPLY], API_KEYS_FILE=str(keys_file))
    assert openai_error(client.get("/v1/models"), 401, False)["code"] == "invalid_api_key"
    wrong = client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer nope-secret"})
    assert openai_error(wrong, 401, False)["param"] == "authorization"
    refused = client.post("/query", json={"request_id": "q", "query": "q"}, headers={"Authorization": "Basic x"})
    assert refused.status_code == 401 and refused.get_json()["field"] == "authorization"
    for key in ("plain-key-1", "hashed-key-2"):
        ok = client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
        assert ok.status_code == 200 and ok.get_json()["choices"][0]["message"]["content"] == REPLY["generated_response"]
    assert client.post("/query", json={"request_id": "q", "query": "q"},
                       headers={"Authorization": "Bearer plain-key-1"}).status_code == 200
    for path in ("/health", "/ready", "/live", "/metrics", "/openapi.json"):
        assert client.get(path).status_code != 401, path
    assert "nope-secret" not in caplog.text and "plain-key-1" not in caplog.text


def test_a_keys_file_without_keys_is_refused_at_start(tmp_path):
    empty = tmp_path / "keys"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError, match="no API keys"):
        query_app([], API_KEYS_FILE=str(empty))
    empty.write_text("sha256:abc\n")
    with pytest.raises(ValueError, match=":1: a sha256: entry"):
        query_app([], API_KEYS_FILE=str(empty))


def test_cors_is_off_by_default():
    _role, client = query_app([REPLY])
    response = client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "https://app.example.com"})
    assert response.status_code == 200 and "Access-Control-Allow-Origin" not in response.headers


def test_cors_answers_preflights_before_keys_and_allows_only_its_origins(keys_file):
    _role, client = query_app([REPLY], CORS_ALLOWED_ORIGINS="https://app.example.com", API_KEYS_FILE=str(keys_file))
    preflight = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    answer = client.options("/v1/chat/completions", headers=preflight)
    assert answer.status_code == 204
    assert answer.headers["Access-Control-Allow-Origin"] == "https://app.example.com"
    assert "POST" in answer.headers["Access-Control-Allow-Methods"]
    assert answer.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    stranger = client.options("/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"})
    assert stranger.status_code == 403 and "Access-Control-Allow-Origin" not in stranger.headers
    response = client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "https://app.example.com",
                                                                       "Authorization": "Bearer plain-key-1"})
    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == "https://app.example.com"
    assert "x-should-retry" in response.headers["Access-Control-Expose-Headers"]


# ---------------------------------------------------------------- /openapi.json

def test_openapi_json_describes_exactly_the_routes_that_exist():
    _role, client = query_app([])
    app = client.application
    routes = {(re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule), method.lower())
              for rule in app.url_map.iter_rules() if rule.endpoint != "static"
              for method in rule.methods - {"HEAD", "OPTIONS"}}
    document = client.get("/openapi.json").get_json()
    assert document == openapi_document() and document["openapi"].startswith("3.")
    described = {(path, method) for path, item in document["paths"].items() for method in item}
    assert described == routes


# ---------------------------------------------------------------- sampling reaches the worker

def test_v1_sampling_fields_reach_the_worker_and_its_seed_comes_back():
    role, client = query_app([])
    seen: list = []
    outcomes = Outcomes([{**REPLY, "seed": 11}, {**REPLY, "seed": 5}, REPLY, REPLY])

    def answer(request, deadline):
        seen.append(request)
        return outcomes.answer(request, deadline)

    role.gateway.set(gateway(WorkerTarget(node=0, answer=answer, probe=lambda: True, local=True)))
    body = {**CHAT, "temperature": 0.7, "top_p": 0.9, "seed": 11, "stop": ["END"], "max_tokens": 512}
    reply = client.post("/v1/chat/completions", json=body).get_json()
    asked = seen[-1]
    assert reply["seed"] == 11 and (asked.max_new_tokens, asked.temperature, asked.top_p, asked.top_k, asked.seed,
                                    asked.stop) == (512, 0.7, 0.9, 0, 11, ("END",))
    # no seed: the worker draws one, and the client gets it back
    assert client.post("/v1/chat/completions", json={**CHAT, "temperature": 1.0}).get_json()["seed"] == 5
    assert seen[-1].seed is None and seen[-1].sampled
    plain = client.post("/v1/chat/completions", json=CHAT).get_json()
    assert "seed" not in plain and seen[-1].is_the_questions_answer  # greedy by default: /query's generation
    assert client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 100_000}).status_code == 200
    assert seen[-1].max_new_tokens == 512  # clamped to OPENAI_MAX_TOKENS_CAP


def test_a_sampled_request_is_not_the_questions_answer_in_the_reply_cache_nor_under_another_id():
    role, client = query_app([REPLY, {**REPLY, "generated_response": "sampled", "seed": 3}, REPLY])
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200  # cached: the question's answer
    sampled = client.post("/v1/chat/completions", json={**CHAT, "temperature": 0.8, "request_id": "s"}).get_json()
    assert sampled["choices"][0]["message"]["content"] == "sampled"  # computed, not the cached greedy answer
    # its id is bound to what it asked: the same id for the greedy question is a conflict, a retry its answer
    assert openai_error(client.post("/v1/chat/completions", json={**CHAT, "request_id": "s"}), 409, False)
    again = client.post("/v1/chat/completions", json={**CHAT, "temperature": 0.8, "request_id": "s"}).get_json()
    assert again["choices"][0]["message"]["content"] == "sampled" and again["seed"] == 3


# ---------------------------------------------------------------- /v1/embeddings' request and response

EMBEDDER = EmbedderModel(spec.EMBEDDER_MODEL, lambda: spec.EMBED_DIM)


def test_embeddings_request_rules():
    model = spec.EMBEDDER_MODEL
    assert parse_embeddings_request({"model": model, "input": "hi"}, 8, EMBEDDER) == (["hi"], "float")
    assert parse_embeddings_request({"model": model, "input": ["a", "b"], "encoding_format": "base64"}, 8,
                                    EMBEDDER)[1] == "base64"
    for body, status, param in (({"model": "x", "input": "a"}, 404, "model"), ({"model": model, "input": [[1, 2]]}, 400, "input"),
                                ({"model": model, "input": []}, 400, "input"), ({"model": model, "input": ["a"] * 9}, 400, "input"),
                                ({"model": model, "input": "a", "encoding_format": "int8"}, 400, "encoding_format")):
        with pytest.raises(ApiError) as info:
            parse_embeddings_request(body, 8, EMBEDDER)
        assert (info.value.status, info.value.field) == (status, param)


def test_embeddings_response_float_and_base64_carry_the_same_vector():
    vector = np.linspace(-1, 1, spec.EMBED_DIM, dtype=np.float32)
    floats = embeddings_response([vector], "float", 3, spec.EMBEDDER_MODEL)
    packed = embeddings_response([vector], "base64", 3, spec.EMBEDDER_MODEL)
    assert floats["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(decoded, vector) and np.array_equal(np.array(floats["data"][0]["embedding"], np.float32), vector)


class NarrowEmbedder:
    """Node 0's own worker with a 384-d embedder (EMBEDDER_MODEL is a setting: its dimension is the model's)."""

    def __init__(self, dim: int = 384):
        self.stages = type("Stages", (), {"embedder": type("Embedder", (), {"dim": dim})()})()

    def embed(self, texts, deadline):
        return [np.full(self.stages.embedder.dim, 0.25, dtype=np.float32) for _ in texts]


def test_embeddings_and_models_name_the_configured_embedder_and_its_own_dimension():
    role, client = query_app([], EMBEDDER_MODEL="acme/embed-small")
    role.worker_role.worker.set(NarrowEmbedder())  # type: ignore[arg-type]
    ids = [m["id"] for m in client.get("/v1/models").get_json()["data"]]
    assert ids == [MODEL, "acme/embed-small", spec.RERANKER_MODEL, spec.TOXICITY_MODEL]
    assert client.get("/v1/models/acme/embed-small").status_code == 200
    assert client.get(f"/v1/models/{spec.EMBEDDER_MODEL}").status_code == 404
    body = {"model": "acme/embed-small", "input": ["a", "b"]}
    reply = client.post("/v1/embeddings", json=body).get_json()
    assert reply["model"] == "acme/embed-small" and [len(d["embedding"]) for d in reply["data"]] == [384, 384]
    assert client.post("/v1/embeddings", json={**body, "dimensions": 384}).status_code == 200
    refused = client.post("/v1/embeddings", json={**body, "dimensions": spec.EMBED_DIM}).get_json()["error"]
    assert refused["param"] == "dimensions" and "384" in refused["message"]
    other = client.post("/v1/embeddings", json={**body, "model": spec.EMBEDDER_MODEL})
    assert other.status_code == 404 and "acme/embed-small" in other.get_json()["error"]["message"]
