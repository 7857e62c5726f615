"""The request bodies chat clients really send, recorded: each client (the `openai` SDK, LangChain's
ChatOpenAI, LiteLLM) holds the same conversation with a recording server on 127.0.0.1, which keeps
each body and answers a minimal chat completion (or stream). `python -m tests.support.client_requests
--write` records them into tests/fixtures/client_requests/ (the clients' pinned versions:
constraints.txt); tests/unit/test_client_requests.py records them again and checks both that they
are what the fixtures hold and that the service accepts them. Open WebUI's bodies (`OPEN_WEBUI`) are
derived from its source, not recorded: their provenance is tests/fixtures/client_requests/README.md."""
from __future__ import annotations

import argparse
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from pipeline import spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "client_requests"
MODEL = spec.GENERATOR_MODEL
SYSTEM = "You are the support desk of an online shop."
# A support conversation: the system message, two earlier turns and the question.
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "My order hasn't arrived yet."},
            {"role": "assistant", "content": "What is the order number?"}, {"role": "user", "content": "ABC123"}]
KEY = "sk-recorded"

_COMPLETION = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "Answer: ok"},
                            "finish_reason": "stop", "logprobs": None}],
               "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
_CHUNKS = [{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Answer: ok"}, "finish_reason": None}]},
           {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
           {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL, "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}]


@contextmanager
def recording_server() -> Iterator[tuple[str, list[dict]]]:
    """A server on 127.0.0.1 that records each POSTed JSON body: (its /v1 base URL, the bodies)."""
    bodies: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            if body.get("stream"):
                data = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in _CHUNKS) + b"data: [DONE]\n\n"
                kind = "text/event-stream"
            else:
                data, kind = json.dumps(_COMPLETION).encode(), "application/json"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", bodies
    finally:
        server.shutdown()
        server.server_close()


def _openai(base: str, **kwargs) -> None:
    import openai
    client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=30)
    response = client.chat.completions.create(model=MODEL, messages=MESSAGES, **kwargs)
    if kwargs.get("stream"):
        list(response)


def _langchain(base: str, stream: bool) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(model=MODEL, base_url=base, api_key=KEY, temperature=0.7, max_tokens=128, seed=42,
                     max_retries=0, timeout=30)
    messages = [SystemMessage(SYSTEM), HumanMessage(MESSAGES[1]["content"]), AIMessage(MESSAGES[2]["content"]),
                HumanMessage(MESSAGES[3]["content"])]
    if stream:
        list(llm.stream(messages))
    else:
        llm.invoke(messages)


def _litellm(base: str, stream: bool) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of its price list
    import litellm
    response = litellm.completion(model=f"openai/{MODEL}", messages=MESSAGES, api_base=base, api_key=KEY,
                                  temperature=0.2, max_tokens=64, stream=stream)
    if stream:
        list(response)


# Each recorded call: its fixture's name, the client, and how the call is made.
CALLS: dict[str, tuple[str, Callable[[str], None]]] = {
    "openai_chat": ("openai", lambda base: _openai(base)),
    "openai_chat_stream": ("openai", lambda base: _openai(base, stream=True, stream_options={"include_usage": True})),
    # What a front-end adds to each request: its end-user id, its tags, and OpenAI's defaults.
    "openai_chat_front_end": ("openai", lambda base: _openai(
        base, user="user-42", metadata={"conversation": "c-7"}, store=False, service_tier="auto",
        temperature=0.2, max_completion_tokens=256)),
    "langchain_invoke": ("langchain-openai", lambda base: _langchain(base, stream=False)),
    "langchain_stream": ("langchain-openai", lambda base: _langchain(base, stream=True)),
    "litellm_completion": ("litellm", lambda base: _litellm(base, stream=False)),
    "litellm_stream": ("litellm", lambda base: _litellm(base, stream=True)),
}


# Open WebUI's bodies (derived from its 0.12.4 source), each with what it asks: "chat" is the
# conversation above; "task" is one of its background tasks, a single question over that chat.
OPEN_WEBUI = {"open_webui_chat_stream": "chat", "open_webui_chat_params": "chat", "open_webui_title": "task",
              "open_webui_tags": "task", "open_webui_follow_ups": "task"}


def record(name: str) -> dict:
    """The body the call `name` sends, recorded now."""
    with recording_server() as (base, bodies):
        CALLS[name][1](base)
    (body,) = bodies
    return body


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="record every call into the fixtures")
    args = parser.parse_args(argv)
    from importlib.metadata import version
    for name, (client, _) in CALLS.items():
        recorded = {"client": f"{client} {version(client)}", "call": name, "path": "/v1/chat/completions",
                    "body": record(name)}
        if args.write:
            FIXTURES.mkdir(parents=True, exist_ok=True)
            (FIXTURES / f"{name}.json").write_text(json.dumps(recorded, indent=1) + "\n")
        print(json.dumps(recorded))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
