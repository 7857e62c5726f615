#!/usr/bin/env python3
"""Send JSON queries to the gateway, like the course's client.

Checks /health, then sends requests from separate threads at a fixed
interval (each waiting up to 300 s), prints every answer and a summary.
    NODE_0_IP=127.0.0.1:8000 python client.py [--requests N] [--interval S] [--queries-file F]
With --stream, the requests go one at a time with "stream": true and each answer is printed
as it is generated (the /query event stream: services/server/sse.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TextIO

import requests

from pipeline.spec import REFERENCE_QUERIES, validate_reply  # client.py sits beside the packages
from services.cluster.health_wait import wait_healthy
from services.server import sse

DEFAULT_QUERIES = list(REFERENCE_QUERIES)  # the course client's eight queries


def wait_for_health(base_url: str, wait_s: float) -> dict:
    try:
        return wait_healthy(base_url, wait_s)
    except TimeoutError:
        raise SystemExit(f"gateway at {base_url} is not healthy after {wait_s:.0f}s") from None


def send(base_url: str, request_id: str, query: str, timeout_s: float, results: list, lock: threading.Lock):
    started = time.monotonic()
    outcome: tuple[int | None, dict]
    try:
        response = requests.post(f"{base_url}/query", json={"request_id": request_id, "query": query},
                                 timeout=timeout_s)
        try:
            body = response.json()
        except ValueError:
            body = {"error": response.text[:200]}
        outcome = (response.status_code, body)
    except requests.RequestException as exc:
        outcome = (None, {"error": f"{type(exc).__name__}: {exc}"})
    elapsed = time.monotonic() - started
    status, body = outcome
    # A 200 whose body breaks the contract is a failure too, reported with what is wrong.
    problems = validate_reply(body, request_id) if status == 200 else []
    with lock:
        results.append((request_id, query, status, body, elapsed, problems))
        if status == 200 and problems:
            print(f"[{request_id}] {elapsed:6.1f}s  INVALID REPLY: {'; '.join(problems)}", flush=True)
        elif status == 200:
            print(f"[{request_id}] {elapsed:6.1f}s  Q: {query}\n    A: {body.get('generated_response')!r}\n"
                  f"    sentiment={body.get('sentiment')} is_toxic={body.get('is_toxic')}"
                  f" served_by={body.get('served_by', '?')}", flush=True)
        else:
            print(f"[{request_id}] {elapsed:6.1f}s  FAILED ({status}): {body.get('error')}", flush=True)


def stream_query(base_url: str, request_id: str, query: str, timeout_s: float,
                 out: TextIO | None = None) -> tuple[int | None, dict, str]:
    """POST one query with "stream": true, writing each text piece to `out` (stdout) as it arrives.

    Returns (status, body, the pieces joined): 200 and the reply event's reply; an error event's
    status and {"error": message}; the status and JSON body of a request refused before its
    stream began; None and {"error": ...} when the stream broke or ended without a reply.
    """
    out = sys.stdout if out is None else out
    pieces: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        with requests.post(f"{base_url}/query", json={"request_id": request_id, "query": query, "stream": True},
                           headers={"Accept": sse.MEDIA_TYPE}, stream=True, timeout=timeout_s) as response:
            if response.status_code != 200 or not response.headers.get("Content-Type", "").startswith(sse.MEDIA_TYPE):
                try:
                    return response.status_code, response.json(), ""
                except ValueError:
                    return response.status_code, {"error": response.text[:200]}, ""
            for event in sse.iter_events(sse.iter_lines(_chunks(response))):
                if event.name == sse.TOKEN:
                    pieces.append(event.json()["text"])
                    out.write(pieces[-1])
                    out.flush()
                elif event.name == sse.REPLY:
                    return 200, event.json(), "".join(pieces)
                elif event.name == sse.ERROR:
                    error = event.json()
                    return error.get("status"), {"error": error.get("error")}, "".join(pieces)
                if time.monotonic() > deadline:
                    return None, {"error": f"no reply within {timeout_s:.0f}s"}, "".join(pieces)
    except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
        return None, {"error": f"{type(exc).__name__}: {exc}"}, "".join(pieces)
    return None, {"error": "the stream ended without a reply"}, "".join(pieces)


def _chunks(response: requests.Response) -> Iterator[bytes]:
    """The body as it arrives: read1 returns what the socket has instead of waiting for a full buffer."""
    read1 = getattr(response.raw, "read1", None)
    if read1 is None:  # urllib3 1.x: whole HTTP chunks (the server sends one per event)
        yield from response.iter_content(chunk_size=None)
        return
    while chunk := read1(65536):
        yield chunk


def send_streaming(base_url: str, request_id: str, query: str, timeout_s: float, results: list) -> None:
    """One streamed request: the question, the answer as it is generated, then its labels."""
    started = time.monotonic()
    print(f"[{request_id}] Q: {query}\n    A: ", end="", flush=True)
    status, body, streamed = stream_query(base_url, request_id, query, timeout_s)
    elapsed = time.monotonic() - started
    problems = validate_reply(body, request_id) if status == 200 else []
    if status == 200 and streamed != body.get("generated_response"):
        problems.append("the streamed pieces differ from generated_response")
    results.append((request_id, query, status, body, elapsed, problems))
    if status == 200 and problems:
        print(f"\n    {elapsed:6.1f}s  INVALID REPLY: {'; '.join(problems)}", flush=True)
    elif status == 200:
        print(f"\n    sentiment={body.get('sentiment')} is_toxic={body.get('is_toxic')}"
              f" served_by={body.get('served_by', '?')}  ({elapsed:.1f}s)", flush=True)
    else:
        print(f"\n    {elapsed:6.1f}s  FAILED ({status}): {body.get('error')}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Send JSON queries to the gateway (node 0).")
    parser.add_argument("--requests", type=int, default=None, help="how many requests (default: one per query)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between requests")
    parser.add_argument("--queries-file", help="a file with one query per line")
    parser.add_argument("--timeout", type=float, default=300.0, help="per-request timeout (s)")
    parser.add_argument("--wait-health", type=float, default=300.0, help="how long to wait for /health")
    parser.add_argument("--url", default=None, help="gateway base URL (default http://$NODE_0_IP)")
    parser.add_argument("--json", action="store_true", help="print the replies as JSON lines at the end")
    parser.add_argument("--stream", action="store_true",
                        help="stream each answer as it is generated; the requests go one at a time")
    args = parser.parse_args(argv)

    base_url = args.url or f"http://{os.environ.get('NODE_0_IP', '127.0.0.1:8000')}"
    queries = DEFAULT_QUERIES
    if args.queries_file:
        with open(args.queries_file, encoding="utf-8") as f:
            queries = [line.strip() for line in f if line.strip()]
    count = args.requests if args.requests is not None else len(queries)

    health = wait_for_health(base_url, args.wait_health)
    print(f"gateway healthy: {json.dumps(health)}", flush=True)
    results: list = []
    lock = threading.Lock()
    threads = []
    run_id = uuid.uuid4().hex[:8]
    started = time.monotonic()
    for i in range(count):
        if args.stream:  # one answer at a time: concurrent streams would interleave on the terminal
            send_streaming(base_url, f"{run_id}-{i}", queries[i % len(queries)], args.timeout, results)
            continue
        thread = threading.Thread(target=send, args=(base_url, f"{run_id}-{i}", queries[i % len(queries)],
                                                     args.timeout, results, lock))
        thread.start()
        threads.append(thread)
        if i + 1 < count:
            time.sleep(args.interval)
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started

    ok = [r for r in results if r[2] == 200 and not r[5]]
    latencies = sorted(r[4] for r in results)
    print(f"\nsummary: sent {count}, succeeded {len(ok)}, failed {count - len(ok)}, elapsed {elapsed:.1f}s")
    for request_id, _query, status, _body, latency, _problems in sorted(results):
        print(f"  {request_id}: {status} in {latency:.1f}s")
    if latencies:
        print(f"latency: min {latencies[0]:.1f}s, median {latencies[len(latencies) // 2]:.1f}s, "
              f"max {latencies[-1]:.1f}s")
    if args.json:
        for r in sorted(results):
            print(json.dumps({"request_id": r[0], "status": r[2], **r[3]}))
    return 0 if len(ok) == count else 1


if __name__ == "__main__":
    sys.exit(main())
