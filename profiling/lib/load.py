"""Load generation against node 0's POST /query or /v1/chat/completions: open-loop schedules (one thread per
request, sent on time whatever the service does) and closed loops (C clients). Every loop is bounded in count and in
time: a LoadTarget carries a hard deadline after which nothing is sent and no request is waited for."""
from __future__ import annotations

import dataclasses
import math
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import requests

from pipeline import spec
from services.server import sse

COURSE_SCHEDULE = "10x10,20x5,50x1"  # the course client's three runs: count x interval (s)
MIN_REQUEST_TIMEOUT_S = 1.0
JOIN_GRACE_S = 5.0  # past the deadline, how long to wait for threads whose timeout was cut
INVALID_REPLY = "invalid_reply"


@dataclass(frozen=True)
class OpenGroup:
    """count requests sent interval_s apart (open loop), whatever the replies do."""
    name: str
    count: int
    interval_s: float


@dataclass(frozen=True)
class ClosedGroup:
    """concurrency clients, each sending its next request when its reply arrives."""
    name: str
    count: int
    concurrency: int
    duration_s: float | None = None


Group = OpenGroup | ClosedGroup
_PHASE = re.compile(r"^\s*(\d+)\s*x\s*(\d+(?:\.\d*)?|\.\d+)\s*$")


def parse_schedule(raw: str, time_scale: float = 1.0) -> list[OpenGroup]:
    """'course' or 'COUNTxINTERVAL,...' (e.g. 10x10,20x5) into open-loop phases.

    time_scale multiplies every interval (0.01 turns the course's 10 s into 0.1 s for tests)."""
    text = COURSE_SCHEDULE if raw.strip().lower() == "course" else raw
    phases = []
    for part in text.split(","):  # not split_list: an empty part is an error here, not a blank to drop
        match = _PHASE.match(part)
        if not match or int(match.group(1)) < 1:
            raise ValueError(f"schedule part {part!r}: expected COUNTxINTERVAL such as 10x10 (10 requests 10 s apart)")
        count, interval = int(match.group(1)), float(match.group(2))
        phases.append(OpenGroup(f"{count}x{match.group(2)}", count, interval * time_scale))
    return phases


def load_queries(path: str | None) -> list[str]:
    """One query per line of `path`, or the SPEC's eight when no file is given."""
    if not path:
        return list(spec.REFERENCE_QUERIES)
    queries = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not queries:
        raise ValueError(f"{path} holds no queries")
    return queries


@dataclass
class RequestRecord:
    request_id: str
    group: str
    query_index: int
    scheduled_s: float  # planned send time, seconds from the start of the run
    send_s: float = math.nan  # actual send time (open loop lag = send_s - scheduled_s)
    latency_s: float = math.nan
    status: int = 0  # HTTP status; 0 when no response came back
    error: str = ""  # "" for a valid 200 reply
    served_by: str = ""
    # Streamed requests (LoadTarget.stream): from the send to the first text piece, the mean gap
    # between the pieces that followed, and how many pieces came.
    ttft_s: float = math.nan
    itl_s: float = math.nan
    pieces: int = 0

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def finished(self) -> bool:
        return not math.isnan(self.latency_s)

    @property
    def done_s(self) -> float:
        return self.send_s + self.latency_s

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


def reply_error(body: object, request_id: str) -> str:
    """'' when a 200 body honours the SPEC's reply contract, else 'invalid_reply'."""
    return INVALID_REPLY if spec.validate_reply(body, request_id) else ""


def chat_reply_error(reply: Any, request_id: str) -> str:
    """'' for a chat.completion that answers this request, else why not."""
    if not isinstance(reply, dict) or not reply.get("choices"):
        return "bad_reply"
    if (reply.get("rag") or {}).get("request_id") != request_id:
        return "wrong_request_id"
    return "" if isinstance(reply["choices"][0].get("message", {}).get("content"), str) else "bad_reply"


def json_or_none(response: requests.Response) -> dict | None:
    """The response's JSON object, or None when it is not JSON or not an object."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


@dataclass(frozen=True)
class ChatLoad:
    """What each /v1/chat/completions request asks beyond its query: None leaves the field out (the
    server's default)."""
    temperature: float | None = None
    seed_base: int | None = None  # request i of a group gets seed seed_base + i (reproducible sampled load)
    max_tokens: int | None = None

    def body(self, request_id: str, query: str, index: int, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": spec.GENERATOR_MODEL, "request_id": request_id,
                                "messages": [{"role": "user", "content": query}]}
        fields = {"temperature": self.temperature, "max_tokens": self.max_tokens, "stream": stream or None,
                  "seed": None if self.seed_base is None else self.seed_base + index}
        return {**body, **{k: v for k, v in fields.items() if v is not None}}


def _read_reply(response: requests.Response, record: RequestRecord, started: float) -> None:
    body = json_or_none(response)
    record.error = reply_error(body, record.request_id)
    record.served_by = str((body or {}).get("served_by", ""))


def _read_stream(response: requests.Response, record: RequestRecord, started: float) -> None:
    """A /query stream as it comes: its pieces timed, its reply checked like a plain one."""
    arrivals, reply, failed = [], None, ""
    for event in sse.iter_events(sse.iter_lines(response.iter_content(chunk_size=None))):
        if event.name == sse.TOKEN:
            arrivals.append(time.monotonic())
        elif event.name == sse.REPLY:
            reply = event.json()
        elif event.name == sse.ERROR:
            failed = f"stream_{event.json().get('status', 'error')}"
    _time_pieces(record, arrivals, started)
    record.error = failed or ("stream_without_reply" if reply is None else reply_error(reply, record.request_id))
    if reply is not None:
        record.served_by = str(reply.get("served_by", ""))


def _read_chat_reply(response: requests.Response, record: RequestRecord, started: float) -> None:
    record.error = chat_reply_error(json_or_none(response), record.request_id)


def _read_chat_stream(response: requests.Response, record: RequestRecord, started: float) -> None:
    """A stream of chat.completion.chunk events up to `data: [DONE]`, its text pieces timed."""
    arrivals, error, done = [], "", False
    for event in sse.iter_events(sse.iter_lines(response.iter_content(chunk_size=None))):
        if event.data == "[DONE]":
            done = True
            break
        chunk = event.json()
        if "error" in chunk:
            error = f"stream_{chunk['error'].get('code') or 'error'}"
        elif any(choice.get("delta", {}).get("content") for choice in chunk.get("choices", [])):
            arrivals.append(time.monotonic())
    _time_pieces(record, arrivals, started)
    record.error = error or ("" if done else "stream_without_done")


def _time_pieces(record: RequestRecord, arrivals: Sequence[float], started: float) -> None:
    """How many text pieces came, the time to the first, and the mean gap between them."""
    record.pieces = len(arrivals)
    if arrivals:
        record.ttft_s = arrivals[0] - started
    if len(arrivals) > 1:
        record.itl_s = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)


@dataclass
class LoadTarget:
    url: str
    queries: Sequence[str]
    timeout_s: float
    deadline: float  # time.monotonic() after which nothing is sent and nothing waited for
    # One clock for the whole invocation: every record's times are seconds since t0,
    # so phases and levels lie on one timeline and "overall" spans them all.
    t0: float = field(default_factory=time.monotonic)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    deadline_hit: bool = False  # something planned was not sent because of the deadline
    id_prefix: str = "lg"  # request ids: PREFIX-RUN-GROUP-I
    # What a timeout cut short by the deadline counts as; None: its exception class, like any timeout.
    cut_error: str | None = "max_duration_cut"
    # Ask for the answer as a stream ("stream": true) and time its pieces as they arrive.
    stream: bool = False
    # Send POST /v1/chat/completions with these fields instead of POST /query.
    chat: ChatLoad | None = None

    def past_deadline(self) -> bool:
        if time.monotonic() >= self.deadline:
            self.deadline_hit = True
        return self.deadline_hit

    def request_timeout(self) -> tuple[float, bool]:
        """(timeout, cut): the per-request timeout, cut so the request ends by the deadline."""
        left = self.deadline - time.monotonic()
        if left < self.timeout_s:
            return max(MIN_REQUEST_TIMEOUT_S, left), True
        return self.timeout_s, False

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def record(self, group: str, i: int, scheduled_s: float) -> RequestRecord:
        return RequestRecord(f"{self.id_prefix}-{self.run_id}-{group}-{i}", group, i, scheduled_s)

    def send(self, record: RequestRecord, session: requests.Session | None = None) -> RequestRecord:
        """POST one request for the record; fills its send time, latency, status and error kind."""
        timeout, cut = self.request_timeout()
        query = self.queries[record.query_index % len(self.queries)]
        if self.chat is not None:
            path, read = "/v1/chat/completions", _read_chat_stream if self.stream else _read_chat_reply
            body = self.chat.body(record.request_id, query, record.query_index, self.stream)
        else:
            path, read = "/query", _read_stream if self.stream else _read_reply
            body = {"request_id": record.request_id, "query": query, **({"stream": True} if self.stream else {})}
        post = session.post if session is not None else requests.post
        started = time.monotonic()
        record.send_s = started - self.t0
        try:
            with post(f"{self.url}{path}", json=body, timeout=timeout, stream=self.stream) as response:
                record.status = response.status_code
                if response.status_code != 200:
                    record.error = f"http_{response.status_code}"
                else:
                    read(response, record, started)
        except requests.Timeout as exc:
            record.error = self.cut_error if cut and self.cut_error else type(exc).__name__
        except requests.RequestException as exc:
            record.error = type(exc).__name__
        record.latency_s = time.monotonic() - started
        return record


def run_open(target: LoadTarget, group: OpenGroup, *, send_until: float | None = None,
             max_outstanding: int | None = None) -> list[RequestRecord]:
    """One thread per request, started on schedule (as the course client does), then all joined.

    Requests whose time falls after the deadline (or after send_until, a monotonic
    time the caller chose) are not sent: they are left out of the records. With
    max_outstanding, a send waits for a free slot (at most until the send bound):
    a service that stopped answering does not pile up threads."""
    start = time.monotonic()
    stop_at = target.deadline if send_until is None else min(send_until, target.deadline)
    slots = threading.BoundedSemaphore(max_outstanding) if max_outstanding else None
    records, threads = [], []
    for i in range(group.count):
        planned = start + i * group.interval_s
        if planned >= target.deadline:
            target.deadline_hit = True
        if planned >= stop_at:
            break
        time.sleep(max(0.0, planned - time.monotonic()))
        if slots is not None and not slots.acquire(timeout=max(0.0, stop_at - time.monotonic())):
            break
        record = target.record(group.name, i, planned - target.t0)
        thread = threading.Thread(target=_send_in_slot, args=(target, record, slots), daemon=True, name=f"req-{i}")
        thread.start()
        records.append(record)
        threads.append(thread)
    _join_all(threads, target.deadline)
    return records


def _send_in_slot(target: LoadTarget, record: RequestRecord, slots: threading.BoundedSemaphore | None) -> None:
    try:
        target.send(record)
    finally:
        if slots is not None:
            slots.release()


def run_closed(target: LoadTarget, group: ClosedGroup) -> list[RequestRecord]:
    """concurrency clients (a keep-alive session each) sharing one request counter.

    Bounded by count, by the group's duration (no new sends after it) and by the deadline."""
    start = time.monotonic()
    stop_at = min(target.deadline, start + group.duration_s) if group.duration_s else target.deadline
    records: list[RequestRecord] = []
    lock = threading.Lock()

    def claim() -> RequestRecord | None:
        with lock:
            i = len(records)
            if i >= group.count or target.past_deadline() or time.monotonic() >= stop_at:
                return None
            records.append(target.record(group.name, i, target.now_s()))
            return records[-1]

    def client() -> None:
        with requests.Session() as session:
            while (record := claim()) is not None:
                target.send(record, session)

    threads = [threading.Thread(target=client, daemon=True, name=f"client-{c}")
               for c in range(min(group.concurrency, group.count))]
    for thread in threads:
        thread.start()
    _join_all(threads, target.deadline)
    return records


def run_group(target: LoadTarget, group: Group) -> list[RequestRecord]:
    return run_open(target, group) if isinstance(group, OpenGroup) else run_closed(target, group)


def _join_all(threads: Sequence[threading.Thread], deadline: float) -> None:
    for thread in threads:
        thread.join(timeout=max(0.0, deadline + JOIN_GRACE_S - time.monotonic()))

