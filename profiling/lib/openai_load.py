"""The load generator's /v1/chat/completions requests (loadgen --api openai): the body it sends,
with sampling (temperature, a seed per request from --seed-base) when asked, and how a reply
or a stream of chat.completion.chunk events is read and checked."""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

import requests

from pipeline import spec

DONE = "[DONE]"


@dataclass(frozen=True)
class ChatLoad:
    """What each /v1 request asks beyond its query: None leaves the field out (the server's default)."""
    temperature: float | None = None
    seed_base: int | None = None  # request i of a group gets seed seed_base + i (reproducible sampled load)
    max_tokens: int | None = None

    def body(self, request_id: str, query: str, index: int, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": spec.GENERATOR_MODEL, "request_id": request_id,
                                "messages": [{"role": "user", "content": query}]}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.seed_base is not None:
            body["seed"] = self.seed_base + index
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if stream:
            body["stream"] = True
        return body


def add_request_args(p: argparse.ArgumentParser) -> None:
    """loadgen's options for what each request asks: streamed or not, and by which API."""
    p.add_argument("--stream", action="store_true",
                   help="ask for each answer as a stream and report the time to first token and the "
                        "inter-token gap, from the client's side, beside the total latency")
    p.add_argument("--api", choices=("query", "openai"), default="query",
                   help="query: POST /query (greedy, the contract's); openai: POST /v1/chat/completions")
    p.add_argument("--temperature", type=float, default=None,
                   help="--api openai: each request's temperature (unset: the server's default)")
    p.add_argument("--seed-base", type=int, default=None,
                   help="--api openai: request i of a group gets seed N + i (unset: the server draws one)")
    p.add_argument("--max-tokens", type=int, default=None, help="--api openai: each request's max_tokens")


def chat_load(args: argparse.Namespace) -> ChatLoad | None:
    """The /v1 requests' fields, or None for /query."""
    if args.api != "openai":
        return None
    return ChatLoad(args.temperature, args.seed_base, args.max_tokens)


def reply_error(reply: Any, request_id: str) -> str:
    """'' for a chat.completion that answers this request, else why not."""
    if not isinstance(reply, dict) or not reply.get("choices"):
        return "bad_reply"
    if (reply.get("rag") or {}).get("request_id") != request_id:
        return "wrong_request_id"
    return "" if isinstance(reply["choices"][0].get("message", {}).get("content"), str) else "bad_reply"


def send_chat(post: Callable[..., requests.Response], url: str, body: dict, timeout: float) -> dict[str, Any]:
    """POST one chat completion; the record's fields: status, error, and for a stream its piece times."""
    started = time.monotonic()
    if not body.get("stream"):
        response = post(f"{url}/v1/chat/completions", json=body, timeout=timeout)
        if response.status_code != 200:
            return {"status": response.status_code, "error": f"http_{response.status_code}"}
        try:
            reply = response.json()
        except ValueError:
            reply = None
        return {"status": 200, "error": reply_error(reply, body["request_id"])}
    with post(f"{url}/v1/chat/completions", json=body, timeout=timeout, stream=True) as response:
        if response.status_code != 200:
            return {"status": response.status_code, "error": f"http_{response.status_code}"}
        arrivals, error, done = [], "", False
        for line in response.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == DONE:
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                error = f"stream_{event['error'].get('code') or 'error'}"
            elif any(choice.get("delta", {}).get("content") for choice in event.get("choices", [])):
                arrivals.append(time.monotonic())
    fields: dict[str, Any] = {"status": 200, "error": error or ("" if done else "stream_without_done"),
                              "pieces": len(arrivals)}
    if arrivals:
        fields["ttft_s"] = arrivals[0] - started
    if len(arrivals) > 1:
        fields["itl_s"] = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
    return fields
