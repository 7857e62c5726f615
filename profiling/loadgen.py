"""Load generator: drives node 0's POST /query over HTTP and reports what the service did.

    python -m profiling.loadgen --url http://127.0.0.1:8000 [--metrics-urls URL,URL,URL]
        (--schedule course | --schedule 10x10,20x5 [--time-scale F]   open loop, the course client's way
         | --rate R --count N                                        open loop, R requests per second
         | --concurrency C --count N [--duration S]                  closed loop, C clients
         | --sweep 1,2,4,8 --count-per-level N)                      closed loop at each level
        [--out runs/loadgen] [--name NAME] [--timeout 300] [--max-duration 1800] [--queries-file F]

Open loop sends at fixed times whatever the service does (as the course client
does: one thread per request), so queueing shows up as latency; closed loop
keeps C requests in flight, so it finds the throughput the service can sustain.
`--schedule course` runs the course client's three runs one after the other:
10 requests 10 s apart, 20 at 5 s, 50 at 1 s; each run waits for its replies
before the next starts, like separate invocations of the course client.

Every run is bounded in count and in time: `--max-duration` is a hard deadline
for the whole invocation (no request is sent after it, and the timeouts of
requests in flight are cut so they end by it). Load goes only to the URLs
given, and by default only to loopback addresses (`--allow-remote` lifts that):
these machines may send load to nothing else.

Reports throughput (successful requests per minute), latency percentiles of
successful requests, errors by kind (`http_<status>`, the exception class, or
`invalid_reply`), and from each node's /metrics (before/after deltas) each
stage's mean batch size, mean batch run time and mean queue wait, plus peak RSS.
Writes DIR/loadgen_<name>.csv (one row per request), DIR/loadgen_<name>.json
(the summary) and PNG plots (latency over time; for --sweep, throughput against p95).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import ipaddress
import json
import math
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence
from urllib.parse import urlsplit

import numpy as np
import requests

from pipeline import spec
from pipeline.config import STAGES as PIPELINE_STAGES, ConfigError, Settings

DEFAULT_OUT = Path("runs/loadgen")
COURSE_SCHEDULE = "10x10,20x5,50x1"  # the course client's three runs: count x interval (s)
DEFAULT_MAX_DURATION_S = 1800.0
DEFAULT_KNEE_RATIO = 1.0
SCRAPE_TIMEOUT_S = 10.0
MIN_REQUEST_TIMEOUT_S = 1.0
JOIN_GRACE_S = 5.0  # past the deadline, how long to wait for threads whose timeout was cut


# ------------------------------------------------------------------------- target guard

class TargetRefused(ValueError):
    """A URL this tool will not send to (not http, or not loopback without --allow-remote)."""


def check_target(url: str, allow_remote: bool) -> str:
    """The URL without a trailing slash, if it is http(s) and (unless allowed) loopback.

    Only literal loopback addresses and 'localhost' pass: a host name could
    resolve anywhere, so it is not resolved to decide.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused(f"{url!r}: expected an http URL such as http://127.0.0.1:8000")
    if not allow_remote and not is_loopback(parts.hostname):
        raise TargetRefused(f"{url!r}: refusing to send load to {parts.hostname}: only loopback "
                            "(127.0.0.0/8, ::1, localhost) unless --allow-remote is given")
    return url.rstrip("/")


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ------------------------------------------------------------------------- plan

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

    time_scale multiplies every interval (0.01 turns the course's 10 s into 0.1 s for tests).
    """
    text = COURSE_SCHEDULE if raw.strip().lower() == "course" else raw
    phases = []
    for part in text.split(","):
        match = _PHASE.match(part)
        if not match or int(match.group(1)) < 1:
            raise ValueError(f"schedule part {part!r}: expected COUNTxINTERVAL such as 10x10 (10 requests 10 s apart)")
        count, interval = int(match.group(1)), float(match.group(2))
        phases.append(OpenGroup(f"{count}x{match.group(2)}", count, interval * time_scale))
    return phases


def plan_groups(args: argparse.Namespace) -> tuple[str, list[Group]]:
    """The mode's name and its groups (phases or levels), from the parsed arguments."""
    if args.schedule:
        return "schedule", parse_schedule(args.schedule, args.time_scale)
    if args.rate is not None:
        return "rate", [OpenGroup(f"rate{args.rate:g}", args.count, 1.0 / args.rate)]
    if args.concurrency is not None:
        return "closed", [ClosedGroup(f"c{args.concurrency}", args.count, args.concurrency, args.duration)]
    return "sweep", [ClosedGroup(f"c{level}", args.count_per_level, level, args.duration) for level in args.sweep]


def default_name(args: argparse.Namespace, mode: str) -> str:
    if args.name:
        return args.name
    if mode == "schedule":
        return "course" if args.schedule.strip().lower() == "course" else "schedule"
    if mode == "rate":
        return f"rate{args.rate:g}"
    if mode == "closed":
        return f"closed-c{args.concurrency}"
    return "sweep"


# ------------------------------------------------------------------------- one request

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

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def done_s(self) -> float:
        return self.send_s + self.latency_s

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


def reply_error(body: object, request_id: str) -> str:
    """'' when a 200 body honours the SPEC's reply contract, else 'invalid_reply'."""
    if (isinstance(body, dict) and body.get("request_id") == request_id
            and isinstance(body.get("generated_response"), str)
            and body.get("sentiment") in spec.SENTIMENTS and body.get("is_toxic") in ("true", "false")):
        return ""
    return "invalid_reply"


@dataclass
class Target:
    url: str
    queries: Sequence[str]
    timeout_s: float
    deadline: float  # time.monotonic() after which nothing is sent and nothing waited for
    # One clock for the whole invocation: every record's times are seconds since t0,
    # so phases and levels lie on one timeline and "overall" spans them all.
    t0: float = field(default_factory=time.monotonic)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    deadline_hit: bool = False  # something planned was not sent because of --max-duration

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

    def send(self, record: RequestRecord, session: requests.Session | None = None) -> RequestRecord:
        """POST /query for one record; fills its send time, latency, status and error kind."""
        timeout, cut = self.request_timeout()
        body = {"request_id": record.request_id, "query": self.queries[record.query_index % len(self.queries)]}
        post = session.post if session is not None else requests.post
        started = time.monotonic()
        record.send_s = started - self.t0
        try:
            response = post(f"{self.url}/query", json=body, timeout=timeout)
            record.status = response.status_code
            record.error = self._classify(response, record.request_id)
            if response.status_code == 200:
                record.served_by = str(_json_or_none(response, {}).get("served_by", ""))
        except requests.Timeout as exc:
            record.error = "max_duration_cut" if cut else type(exc).__name__
        except requests.RequestException as exc:
            record.error = type(exc).__name__
        record.latency_s = time.monotonic() - started
        return record

    @staticmethod
    def _classify(response: requests.Response, request_id: str) -> str:
        if response.status_code != 200:
            return f"http_{response.status_code}"
        return reply_error(_json_or_none(response, None), request_id)


def _json_or_none(response: requests.Response, default):
    try:
        body = response.json()
    except ValueError:
        return default
    return body if isinstance(body, dict) else default


# ------------------------------------------------------------------------- loops

def run_open(target: Target, group: OpenGroup) -> list[RequestRecord]:
    """One thread per request, started on schedule (as the course client does), then all joined.

    Requests whose time falls after the deadline are not sent (they are left
    out of the records; the summary's 'sent' shows the shortfall).
    """
    start = time.monotonic()
    records, threads = [], []
    for i in range(group.count):
        planned = start + i * group.interval_s
        if planned >= target.deadline:
            target.deadline_hit = True
            break
        _sleep_until(planned)
        record = RequestRecord(f"lg-{target.run_id}-{group.name}-{i}", group.name, i, planned - target.t0)
        thread = threading.Thread(target=target.send, args=(record,), daemon=True, name=f"req-{i}")
        thread.start()
        records.append(record)
        threads.append(thread)
    _join_all(threads, target.deadline)
    return records


def run_closed(target: Target, group: ClosedGroup) -> list[RequestRecord]:
    """concurrency clients (a keep-alive session each) sharing one request counter.

    Bounded by count, by the group's duration (no new sends after it) and by the deadline.
    """
    start = time.monotonic()
    stop_at = min(target.deadline, start + group.duration_s) if group.duration_s else target.deadline
    records: list[RequestRecord] = []
    lock = threading.Lock()

    def claim() -> RequestRecord | None:
        with lock:
            i = len(records)
            if i >= group.count or target.past_deadline() or time.monotonic() >= stop_at:
                return None
            record = RequestRecord(f"lg-{target.run_id}-{group.name}-{i}", group.name, i, target.now_s())
            records.append(record)
            return record

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


def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _join_all(threads: Sequence[threading.Thread], deadline: float) -> None:
    for thread in threads:
        thread.join(timeout=max(0.0, deadline + JOIN_GRACE_S - time.monotonic()))


def run_group(target: Target, group: Group) -> list[RequestRecord]:
    return run_open(target, group) if isinstance(group, OpenGroup) else run_closed(target, group)


# ------------------------------------------------------------------------- statistics

@dataclass(frozen=True)
class LatencyStats:
    """Over successful requests only: an error's latency says how it failed, not how fast we served."""
    count: int
    mean_s: float
    p50_s: float
    p95_s: float
    p99_s: float
    max_s: float

    @classmethod
    def of(cls, latencies: Sequence[float]) -> "LatencyStats":
        if not latencies:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        x = np.asarray(latencies, dtype=float)
        p50, p95, p99 = np.percentile(x, [50, 95, 99])
        return cls(len(x), float(x.mean()), float(p50), float(p95), float(p99), float(x.max()))


@dataclass(frozen=True)
class RunStats:
    name: str
    planned: int
    sent: int
    ok: int
    errors: dict[str, int]
    duration_s: float  # first send to last reply
    throughput_rpm: float  # successful requests per minute over duration_s
    latency: LatencyStats
    max_send_lag_s: float  # open loop: how late the worst send left (a busy load generator shows here)
    served_by: dict[str, int]


def run_stats(name: str, planned: int, records: Sequence[RequestRecord]) -> RunStats:
    sent = [r for r in records if not math.isnan(r.send_s)]
    finished = [r for r in sent if not math.isnan(r.latency_s)]
    ok = [r for r in finished if r.ok]
    errors: dict[str, int] = {}
    for r in sent:
        kind = r.error if not math.isnan(r.latency_s) else "no_reply_by_deadline"
        if kind:
            errors[kind] = errors.get(kind, 0) + 1
    duration = (max(r.done_s for r in finished) - min(r.send_s for r in sent)) if finished else 0.0
    served: dict[str, int] = {}
    for r in ok:
        served[r.served_by or "?"] = served.get(r.served_by or "?", 0) + 1
    return RunStats(
        name=name, planned=planned, sent=len(sent), ok=len(ok), errors=dict(sorted(errors.items())),
        duration_s=duration, throughput_rpm=60.0 * len(ok) / duration if duration > 0 else 0.0,
        latency=LatencyStats.of([r.latency_s for r in ok]),
        max_send_lag_s=max((r.send_s - r.scheduled_s for r in sent), default=0.0),
        served_by=dict(sorted(served.items())),
    )


# ------------------------------------------------------------------------- /metrics

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class MetricsSnapshot:
    url: str
    samples: dict[SampleKey, float]
    error: str = ""  # why there are no samples ("http_404", "ConnectionError", ...)

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def label_values(self, name: str, label: str) -> list[str]:
        return sorted({dict(lbl)[label] for (n, lbl) in self.samples if n == name and label in dict(lbl)})


def parse_metrics(text: str) -> dict[SampleKey, float]:
    """Prometheus text into {(sample name, sorted labels): value}; sample names keep their
    suffixes (_total, _count, _sum, _bucket), so counters and histograms read the same way."""
    from prometheus_client.parser import text_string_to_metric_families
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return samples


def scrape(url: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> MetricsSnapshot:
    try:
        response = requests.get(url, timeout=timeout_s)
    except requests.RequestException as exc:
        return MetricsSnapshot(url, {}, type(exc).__name__)
    if response.status_code != 200:
        return MetricsSnapshot(url, {}, f"http_{response.status_code}")
    try:
        return MetricsSnapshot(url, parse_metrics(response.text))
    except ValueError as exc:  # not Prometheus text
        return MetricsSnapshot(url, {}, f"unparsable: {exc}")


def scrape_all(urls: Sequence[str]) -> list[MetricsSnapshot]:
    return [scrape(url) for url in urls]


@dataclass(frozen=True)
class StageDelta:
    stage: str
    batches: float
    items: float
    mean_batch_size: float
    mean_batch_run_s: float  # per batch
    mean_item_wait_s: float  # per item, submit to batch start
    queue_depth_after: float | None


@dataclass(frozen=True)
class NodeDelta:
    url: str
    error: str
    peak_rss_bytes: float | None
    rss_bytes: float | None
    stages: list[StageDelta]
    http_requests: dict[str, float]  # "endpoint status" -> count during the run


def _delta(before: MetricsSnapshot, after: MetricsSnapshot, *names: str, **labels: str) -> float | None:
    """after - before of the first of `names` that the node exports (counters, histogram sums)."""
    for name in names:
        a = after.get(name, **labels)
        if a is not None:
            return a - (before.get(name, **labels) or 0.0)
    return None


def _stage_order(stage: str) -> tuple[int, str]:
    # Pipeline order reads better than alphabetical; unknown stages go last.
    return (PIPELINE_STAGES.index(stage) if stage in PIPELINE_STAGES else len(PIPELINE_STAGES), stage)


def _ratio(num: float | None, den: float | None) -> float:
    return num / den if num is not None and den else math.nan


def node_delta(before: MetricsSnapshot, after: MetricsSnapshot) -> NodeDelta:
    if after.error:
        return NodeDelta(after.url, after.error, None, None, [], {})
    stages = []
    names = after.label_values("rag_batch_size_count", "stage") or after.label_values("rag_batches_total", "stage")
    for stage in sorted(names, key=_stage_order):
        batches = _delta(before, after, "rag_batch_size_count", "rag_batches_total", stage=stage)
        # Items the stage finished (requests), and items summed over its batches (the
        # histogram's sum); the two agree for request batches, but a continuous-batching
        # stage counts decode steps as batches, whose sizes are rows, not requests.
        items = _delta(before, after, "rag_batch_items_total", "rag_batch_size_sum", stage=stage)
        batched = _delta(before, after, "rag_batch_size_sum", "rag_batch_items_total", stage=stage)
        run_s = _delta(before, after, "rag_batch_run_seconds_total", stage=stage)
        wait_s = _delta(before, after, "rag_batch_wait_seconds_total", stage=stage)
        stages.append(StageDelta(stage, batches or 0.0, items or 0.0, _ratio(batched, batches), _ratio(run_s, batches),
                                 _ratio(wait_s, items), after.get("rag_batch_queue_depth", stage=stage)))
    http = {}
    for (name, labels), value in after.samples.items():
        if name == "rag_http_requests_total":
            d = dict(labels)
            count = value - (before.samples.get((name, labels)) or 0.0)
            if count:
                http[f"{d.get('endpoint', '?')} {d.get('status', '?')}"] = count
    return NodeDelta(after.url, "", after.get("rag_process_peak_rss_bytes"),
                     after.get("process_resident_memory_bytes"), stages, dict(sorted(http.items())))


def node_deltas(before: Sequence[MetricsSnapshot], after: Sequence[MetricsSnapshot]) -> list[NodeDelta]:
    return [node_delta(b, a) for b, a in zip(before, after)]


# ------------------------------------------------------------------------- saturation (sweep)

@dataclass(frozen=True)
class Saturation:
    rule: str
    reached: bool  # False: no knee among the levels tried (go higher)
    level: int | None  # the last level before the knee
    throughput_rpm: float  # at that level
    knee_level: int | None  # the first level past it
    max_throughput_rpm: float
    max_throughput_level: int | None


def saturation_rule(ratio: float) -> str:
    return (f"knee = first step a->b (in level order) where p95 grows more than {ratio:g} x as much as "
            f"throughput: p95_b/p95_a > {ratio:g} * rpm_b/rpm_a (or rpm_b is 0); saturation = level a, "
            "its throughput = the saturation throughput")


def find_saturation(levels: Sequence[int], stats: Sequence[RunStats], ratio: float = DEFAULT_KNEE_RATIO) -> Saturation:
    """The knee of a closed-loop sweep.

    Why a ratio of 1 by default and not 2: in a closed loop, Little's law makes
    latency grow in proportion to the clients once throughput is flat, so with
    doubling levels (1,2,4,8) a fully saturated step has p95 x2 for throughput
    x1, which a factor of 2 never flags. Below saturation throughput grows about
    as fast as the clients and p95 little; past it, p95 outgrows throughput.
    """
    rpm = [s.throughput_rpm for s in stats]
    best = max(range(len(rpm)), key=rpm.__getitem__, default=None)
    best_rpm, best_level = (rpm[best], levels[best]) if best is not None else (0.0, None)
    for a in range(len(levels) - 1):
        b = a + 1
        p95_a, p95_b = stats[a].latency.p95_s, stats[b].latency.p95_s
        if rpm[b] <= 0 or (rpm[a] > 0 and p95_b / p95_a > ratio * rpm[b] / rpm[a]):
            return Saturation(saturation_rule(ratio), True, levels[a], rpm[a], levels[b], best_rpm, best_level)
    return Saturation(saturation_rule(ratio), False, best_level, best_rpm, None, best_rpm, best_level)


# ------------------------------------------------------------------------- outputs

@dataclass
class GroupResult:
    group: Group
    records: list[RequestRecord]
    stats: RunStats
    nodes: list[NodeDelta]


def write_records(path: Path, records: Sequence[RequestRecord]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RequestRecord.columns())
        writer.writeheader()
        for r in records:
            writer.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in dataclasses.asdict(r).items()})
    return path


def _jsonable(value):
    if dataclasses.is_dataclass(value):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no NaN
    return value


def write_summary(path: Path, summary: dict) -> Path:
    path.write_text(json.dumps(_jsonable(summary), indent=2) + "\n")
    return path


def write_plots(out: Path, name: str, results: Sequence[GroupResult], saturation: Saturation | None) -> list[Path]:
    from profiling.plots import latency_plot, sweep_plot
    sent = [r for res in results for r in res.records if not math.isnan(r.send_s)]
    send = [r.send_s for r in sent]
    lat = [0.0 if math.isnan(r.latency_s) else r.latency_s for r in sent]  # no reply: drawn at 0 as an error
    ok = [r.ok and not math.isnan(r.latency_s) for r in sent]
    groups = [r.group for r in sent]
    paths = [latency_plot(out / f"loadgen_{name}_latency.png", f"{name}: latency of each request", send, lat, ok, groups)]
    if saturation is not None:
        levels = [r.group.concurrency for r in results]
        paths.append(sweep_plot(out / f"loadgen_{name}_sweep.png", levels, [r.stats.throughput_rpm for r in results],
                                [r.stats.latency.p95_s for r in results], saturation.level if saturation.reached else None))
    return paths


def format_stats_table(stats: Sequence[RunStats]) -> str:
    header = (f"{'run':<14}{'sent':>6}{'ok':>6}{'req/min':>10}{'p50 s':>9}{'p95 s':>9}{'p99 s':>9}{'max s':>9}"
              f"{'lag s':>8}  errors")
    lines = [header, "-" * len(header)]
    for s in stats:
        lat = s.latency
        errors = ", ".join(f"{k}={v}" for k, v in s.errors.items()) or "none"
        lines.append(f"{s.name:<14}{s.sent:>6}{s.ok:>6}{s.throughput_rpm:>10.2f}{lat.p50_s:>9.2f}{lat.p95_s:>9.2f}"
                     f"{lat.p99_s:>9.2f}{lat.max_s:>9.2f}{s.max_send_lag_s:>8.2f}  {errors}")
    return "\n".join(lines)


def format_nodes_table(nodes: Sequence[NodeDelta]) -> str:
    lines = []
    for node in nodes:
        if node.error:
            lines.append(f"{node.url}: no metrics ({node.error})")
            continue
        peak = f"{node.peak_rss_bytes / 2**20:.0f} MiB" if node.peak_rss_bytes else "?"
        rss = f"{node.rss_bytes / 2**20:.0f} MiB" if node.rss_bytes else "?"
        lines.append(f"{node.url}: peak RSS {peak}, RSS {rss}")
        active = [s for s in node.stages if s.batches]
        if active:
            lines.append(f"  {'stage':<11}{'batches':>8}{'items':>7}{'mean batch':>12}{'run s/batch':>13}{'wait s/item':>13}")
        for s in active:
            lines.append(f"  {s.stage:<11}{s.batches:>8.0f}{s.items:>7.0f}{s.mean_batch_size:>12.2f}"
                         f"{s.mean_batch_run_s:>13.4f}{s.mean_item_wait_s:>13.4f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------- CLI

def wait_healthy(url: str, wait_s: float, deadline: float) -> dict:
    """Like the course client: /health must answer 200 before any load is sent."""
    until = min(time.monotonic() + wait_s, deadline)
    while True:
        try:
            response = requests.get(f"{url}/health", timeout=5)
            if response.status_code == 200:
                return _json_or_none(response, {})
        except requests.RequestException:
            pass
        if time.monotonic() >= until:
            raise TimeoutError(f"{url}/health did not answer 200 within {wait_s:.0f}s")
        time.sleep(1)


def default_metrics_urls(env: Mapping[str, str] | None) -> list[str]:
    settings = Settings.from_env(env)
    return [f"{settings.node_address(n).url}/metrics" for n in range(settings.total_nodes)]


def load_queries(path: str | None) -> list[str]:
    if not path:
        return list(spec.REFERENCE_QUERIES)
    queries = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not queries:
        raise ValueError(f"{path} holds no queries")
    return queries


def _positive(kind):
    def parse(raw: str):
        value = kind(raw)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{raw!r}: expected a number > 0")
        return value
    return parse


def _levels(raw: str) -> list[int]:
    try:
        levels = [int(p) for p in raw.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r}: expected concurrency levels such as 1,2,4,8") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"{raw!r}: levels must be integers >= 1")
    return sorted(set(levels))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m profiling.loadgen", description="Drive node 0 with HTTP load.")
    p.add_argument("--url", required=True, help="node 0's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--metrics-urls", default=None,
                   help="comma-separated /metrics URLs (default: NODE_0_IP..NODE_2_IP from the environment); "
                        "'none' to skip")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--schedule", help="'course' (10x10,20x5,50x1) or COUNTxINTERVAL,... (open loop)")
    mode.add_argument("--rate", type=_positive(float), help="open loop: requests per second (with --count)")
    mode.add_argument("--concurrency", type=_positive(int), help="closed loop: concurrent clients (with --count)")
    mode.add_argument("--sweep", type=_levels, help="closed loop at each concurrency level, e.g. 1,2,4,8")
    p.add_argument("--count", type=_positive(int), help="requests for --rate / --concurrency")
    p.add_argument("--count-per-level", type=_positive(int), help="requests per --sweep level")
    p.add_argument("--duration", type=_positive(float), default=None,
                   help="closed loop: stop sending after this many seconds (per level)")
    p.add_argument("--time-scale", type=_positive(float), default=1.0, help="multiplies --schedule intervals")
    p.add_argument("--knee-ratio", type=_positive(float), default=DEFAULT_KNEE_RATIO,
                   help="--sweep: the knee is where p95 grows more than this times throughput's growth")
    p.add_argument("--queries-file", help="one query per line (default: the SPEC's eight)")
    p.add_argument("--timeout", type=_positive(float), default=300.0, help="per-request timeout (s), as clients wait")
    p.add_argument("--max-duration", type=_positive(float), default=DEFAULT_MAX_DURATION_S,
                   help="hard limit for the whole run (s)")
    p.add_argument("--wait-health", type=float, default=300.0, help="how long to wait for /health 200 first (s)")
    p.add_argument("--allow-remote", action="store_true", help="allow non-loopback targets")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default runs/loadgen)")
    p.add_argument("--name", default=None, help="output name (default from the mode)")
    p.add_argument("--no-plots", action="store_true")
    return p


def validate(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if (args.rate is not None or args.concurrency is not None) and args.count is None:
        p.error("--rate and --concurrency need --count")
    if args.sweep is not None and args.count_per_level is None:
        p.error("--sweep needs --count-per-level")
    if args.schedule:
        try:
            parse_schedule(args.schedule)
        except ValueError as exc:
            p.error(str(exc))


def resolve_urls(args: argparse.Namespace, env: Mapping[str, str] | None) -> tuple[str, list[str]]:
    url = check_target(args.url, args.allow_remote)
    if args.metrics_urls is None:
        metrics = default_metrics_urls(env)
    elif args.metrics_urls.strip().lower() == "none":
        metrics = []
    else:
        metrics = [u.strip() for u in args.metrics_urls.split(",") if u.strip()]
    return url, [check_target(u, args.allow_remote) for u in metrics]


@dataclass
class LoadRun:
    """Everything one invocation measured."""
    name: str
    mode: str
    results: list[GroupResult]
    overall: RunStats  # all groups together: first send to last reply, gaps between phases included
    nodes: list[NodeDelta]  # /metrics deltas over the whole invocation
    saturation: Saturation | None  # --sweep only
    deadline_hit: bool  # --max-duration cut the plan short

    @property
    def records(self) -> list[RequestRecord]:
        return [r for res in self.results for r in res.records]

    @property
    def failed(self) -> bool:
        # A failed request, or a plan cut by --max-duration; stopping at --duration
        # is a bound the caller chose, not a failure.
        return bool(self.overall.errors) or self.deadline_hit


def run(args: argparse.Namespace, url: str, metrics_urls: Sequence[str], queries: Sequence[str],
        deadline: float) -> LoadRun:
    mode, groups = plan_groups(args)
    target = Target(url, queries, args.timeout, deadline)
    first = before = scrape_all(metrics_urls)
    results = []
    for group in groups:
        if target.past_deadline():
            break
        records = run_group(target, group)
        after = scrape_all(metrics_urls)  # per group, so each phase or level gets its own deltas
        results.append(GroupResult(group, records, run_stats(group.name, group.count, records),
                                   node_deltas(before, after)))
        print("done: " + format_stats_table([results[-1].stats]).splitlines()[-1], file=sys.stderr, flush=True)
        before = after
    overall = run_stats("overall", sum(g.count for g in groups), [r for res in results for r in res.records])
    saturation = None
    if mode == "sweep" and results:
        saturation = find_saturation([r.group.concurrency for r in results], [r.stats for r in results],
                                     args.knee_ratio)
    return LoadRun(default_name(args, mode), mode, results, overall, node_deltas(first, before), saturation,
                   target.deadline_hit)


def write_outputs(load: LoadRun, args: argparse.Namespace, extra: dict) -> list[Path]:
    out = Path(args.out)
    summary = {
        "name": load.name, "mode": load.mode, **extra,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "overall": load.overall, "deadline_hit": load.deadline_hit,
        "runs": [{"group": r.group, "stats": r.stats, "nodes": r.nodes} for r in load.results],
        "nodes": load.nodes, "saturation": load.saturation,
    }
    paths = [write_records(out / f"loadgen_{load.name}.csv", load.records),
             write_summary(out / f"loadgen_{load.name}.json", summary)]
    if not args.no_plots:
        paths += write_plots(out, load.name, load.results, load.saturation)
    return paths


def report(load: LoadRun, args: argparse.Namespace) -> str:
    stats = [r.stats for r in load.results] + ([load.overall] if len(load.results) > 1 else [])
    lines = [format_stats_table(stats), format_nodes_table(load.nodes)]
    sat = load.saturation
    if sat is not None:
        verdict = (f"saturation at c={sat.level}: {sat.throughput_rpm:.2f} req/min (knee at c={sat.knee_level})"
                   if sat.reached else
                   f"no knee up to c={load.results[-1].group.concurrency}: saturation not reached; "
                   f"best {sat.max_throughput_rpm:.2f} req/min at c={sat.max_throughput_level}")
        lines.append(f"{verdict}\n  rule: {sat.rule}")
    if load.deadline_hit:
        lines.append(f"--max-duration {args.max_duration:g}s reached: "
                     f"{load.overall.planned - load.overall.sent} planned requests were not sent")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    validate(p, args)
    started = time.monotonic()
    deadline = started + args.max_duration
    try:
        url, metrics_urls = resolve_urls(args, env)
        queries = load_queries(args.queries_file)
    except (TargetRefused, ConfigError, OSError, ValueError) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    try:
        health = wait_healthy(url, args.wait_health, deadline)
    except TimeoutError as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 1
    wall_start = time.time()
    load = run(args, url, metrics_urls, queries, deadline)
    paths = write_outputs(load, args, {"url": url, "metrics_urls": list(metrics_urls), "started_unix": wall_start,
                                       "elapsed_s": time.monotonic() - started, "health": health})
    print(report(load, args))
    print("wrote " + ", ".join(map(str, paths)))
    return 1 if load.failed else 0


if __name__ == "__main__":
    sys.exit(main())
