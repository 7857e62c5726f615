"""Soak benchmark: steady load for N minutes while watching every node's memory.

    python -m profiling.soak --url http://127.0.0.1:8000 [--metrics-urls URL,URL,URL]
        [--minutes 10] (--concurrency 4 | --rate R) [--sample-s 5] [--max-requests N]
        [--timeout 300] [--drain-s 30] [--out runs/soak] [--name NAME] [--allow-remote]

A leak shows as resident memory that keeps climbing under a load that does not
change. So the load is steady (closed loop: C clients, each sending its next
request when its reply arrives; or open loop: R requests per second whatever
the replies do), and every few seconds each node's `/metrics` is scraped for
`process_resident_memory_bytes`. The report compares, per node, the mean RSS of
the first minute (the baseline: models loaded, batches warmed, allocator pools
grown) with the mean of the last minute (runs shorter than 3 minutes use thirds
instead) and flags growth over 5 %. It also counts errors by kind
(`http_<status>`, the exception class, or `invalid_reply`).

Bounded in count and time: no request is sent after --minutes; requests in
flight then get at most --drain-s more (their timeouts are cut); --max-requests
caps the total; every thread is joined with a timeout. Load goes only to
loopback addresses unless --allow-remote is given.

Writes DIR/soak_<name>.json (the summary), DIR/soak_<name>_rss.csv (one row per
node per sample) and DIR/soak_<name>_requests.csv (one row per request).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import requests

from pipeline import spec
from pipeline.config import ConfigError, Settings
from profiling.loadgen import check_target

DEFAULT_OUT = Path("runs/soak")
GROWTH_GOAL_PCT = 5.0
BASELINE_S = 60.0
SCRAPE_TIMEOUT_S = 5.0
JOIN_GRACE_S = 5.0
MIN_REQUEST_TIMEOUT_S = 1.0
RSS_METRIC = "process_resident_memory_bytes"


# ------------------------------------------------------------------------- target guard

# One guard for every load tool: loadgen's (literal loopback only unless --allow-remote).


# ------------------------------------------------------------------------- records

@dataclass
class RequestRecord:
    sent_s: float  # since the start of the run
    latency_s: float
    outcome: str  # "ok", "http_<status>", an exception class, or "invalid_reply"


@dataclass
class RssSample:
    t_s: float
    node_url: str
    rss_bytes: float | None  # None: the scrape failed (counted, not fatal)


class Run:
    """Shared state of one soak run: the clock, the stop rule and what was seen."""

    def __init__(self, url: str, minutes: float, max_requests: int, timeout_s: float, drain_s: float):
        self.url = url
        self.started = time.monotonic()
        self.stop_sending_at = self.started + minutes * 60.0
        self.hard_end = self.stop_sending_at + drain_s
        self.max_requests = max_requests
        self.timeout_s = timeout_s
        self.run_id = uuid.uuid4().hex[:8]
        self.lock = threading.Lock()
        self.sent = 0
        self.records: list[RequestRecord] = []
        self._local = threading.local()  # one Session per sending thread: Sessions are not thread-safe

    @property
    def session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def take_ticket(self) -> int | None:
        """The next request's number, or None once the time or the count is used up."""
        with self.lock:
            if time.monotonic() >= self.stop_sending_at or self.sent >= self.max_requests:
                return None
            self.sent += 1
            return self.sent

    def request_timeout(self) -> float:
        # Cut so that no request outlives the run's hard end.
        return max(MIN_REQUEST_TIMEOUT_S, min(self.timeout_s, self.hard_end - time.monotonic()))

    def send(self, n: int) -> None:
        request_id = f"soak-{self.run_id}-{n}"
        body = {"request_id": request_id, "query": spec.REFERENCE_QUERIES[n % len(spec.REFERENCE_QUERIES)]}
        sent = time.monotonic()
        try:
            response = self.session.post(f"{self.url}/query", json=body, timeout=self.request_timeout())
            outcome = _outcome(response, request_id)
        except requests.RequestException as exc:
            outcome = type(exc).__name__
        with self.lock:
            self.records.append(RequestRecord(sent - self.started, time.monotonic() - sent, outcome))


def _outcome(response: requests.Response, request_id: str) -> str:
    if response.status_code != 200:
        return f"http_{response.status_code}"
    try:
        reply = response.json()
    except ValueError:
        return "invalid_reply"
    ok = (isinstance(reply, dict) and reply.get("request_id") == request_id
          and reply.get("sentiment") in spec.SENTIMENTS and reply.get("is_toxic") in ("true", "false"))
    return "ok" if ok else "invalid_reply"


# ------------------------------------------------------------------------- load

def closed_loop(run: Run, concurrency: int) -> list[threading.Thread]:
    def client():
        while (n := run.take_ticket()) is not None:
            run.send(n)
    return [threading.Thread(target=client, name=f"soak-client-{i}", daemon=True) for i in range(concurrency)]


def open_loop(run: Run, rate: float, max_outstanding: int) -> list[threading.Thread]:
    """One pacing thread; each request on its own thread, at most max_outstanding at once."""
    slots = threading.BoundedSemaphore(max_outstanding)

    def one(n: int):
        try:
            run.send(n)
        finally:
            slots.release()

    def pace():
        interval, next_at = 1.0 / rate, time.monotonic()
        while (n := run.take_ticket()) is not None:
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += interval
            if not slots.acquire(timeout=max(0.0, run.stop_sending_at - time.monotonic())):
                break  # the service stopped answering: do not pile up threads
            threading.Thread(target=one, args=(n,), daemon=True).start()
        # Wait (bounded) for the requests still out, so the run's records are complete.
        for _ in range(max_outstanding):
            if not slots.acquire(timeout=max(0.0, run.hard_end - time.monotonic())):
                break
    return [threading.Thread(target=pace, name="soak-pacer", daemon=True)]


# ------------------------------------------------------------------------- memory

def scrape_rss(session: requests.Session, url: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families
    try:
        response = session.get(f"{url}/metrics", timeout=SCRAPE_TIMEOUT_S)
        response.raise_for_status()
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                if sample.name == RSS_METRIC:
                    return float(sample.value)
    except (requests.RequestException, ValueError):
        pass
    return None


def sampler(run: Run, urls: list[str], every_s: float, samples: list[RssSample], stop: threading.Event):
    session = requests.Session()
    while not stop.is_set() and time.monotonic() < run.hard_end:
        t = run.elapsed()
        for url in urls:
            samples.append(RssSample(round(t, 2), url, scrape_rss(session, url)))
        stop.wait(every_s)


def growth(samples: list[RssSample], urls: list[str], duration_s: float) -> dict[str, dict]:
    """Per node: baseline (first minute, or first third) vs end (last minute, or last third)."""
    window = BASELINE_S if duration_s >= 3 * BASELINE_S else duration_s / 3
    result = {}
    for url in urls:
        points = [(s.t_s, s.rss_bytes) for s in samples if s.node_url == url and s.rss_bytes is not None]
        first = [v for t, v in points if t <= window]
        last = [v for t, v in points if t >= duration_s - window]
        if not first or not last:
            result[url] = {"samples": len(points), "growth_pct": None, "ok": None}
            continue
        base, end = float(np.mean(first)), float(np.mean(last))
        pct = 100.0 * (end - base) / base
        result[url] = {"samples": len(points), "baseline_mib": round(base / 2**20, 1),
                       "end_mib": round(end / 2**20, 1), "peak_mib": round(max(v for _, v in points) / 2**20, 1),
                       "growth_pct": round(pct, 2), "ok": pct < GROWTH_GOAL_PCT}
    return result


# ------------------------------------------------------------------------- report

def summarize(run: Run, samples: list[RssSample], urls: list[str], args: argparse.Namespace) -> dict:
    duration_s = min(run.elapsed(), args.minutes * 60.0)
    outcomes = Counter(r.outcome for r in run.records)
    ok_latencies = [r.latency_s for r in run.records if r.outcome == "ok"]
    errors = {k: v for k, v in outcomes.items() if k != "ok"}
    memory = growth(samples, urls, duration_s)
    return {
        "url": run.url, "mode": f"rate {args.rate}/s" if args.rate else f"closed loop x{args.concurrency}",
        "minutes": args.minutes, "ran_s": round(run.elapsed(), 1), "sent": run.sent,
        "answered": len(run.records), "ok": outcomes.get("ok", 0), "error_count": sum(errors.values()),
        "errors": errors,
        "latency_s": ({f"p{q}": round(float(np.percentile(ok_latencies, q)), 3) for q in (50, 95, 99)}
                      if ok_latencies else {}),
        "throughput_per_min": round(60.0 * len(ok_latencies) / max(duration_s, 1e-9), 1),
        "rss_growth_goal_pct": GROWTH_GOAL_PCT, "rss": memory,
        "rss_ok": all(m["ok"] for m in memory.values()) if memory else None,
        "scrape_failures": sum(1 for s in samples if s.rss_bytes is None),
    }


def write_outputs(out: Path, name: str, summary: dict, samples: list[RssSample], run: Run) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"soak_{name}.json", out / f"soak_{name}_rss.csv", out / f"soak_{name}_requests.csv"]
    paths[0].write_text(json.dumps(summary, indent=2) + "\n")
    for path, rows, fields in ((paths[1], samples, RssSample), (paths[2], run.records, RequestRecord)):
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(fields.__dataclass_fields__))
            writer.writeheader()
            writer.writerows(asdict(row) for row in rows)
    return paths


# ------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Steady load for N minutes; report each node's RSS growth")
    parser.add_argument("--url", required=True, help="the gateway (node 0), e.g. http://127.0.0.1:8000")
    parser.add_argument("--metrics-urls", default="",
                        help="comma-separated node URLs to scrape (default: NODE_0_IP..NODE_2_IP from the environment)")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to send load (default 10)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, default=None, help="closed loop: this many clients (default 4)")
    mode.add_argument("--rate", type=float, default=None, help="open loop: requests per second")
    parser.add_argument("--max-outstanding", type=int, default=256, help="open loop: most requests out at once")
    parser.add_argument("--max-requests", type=int, default=1_000_000, help="hard cap on requests sent")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--timeout", type=float, default=300.0, help="per-request timeout (s)")
    parser.add_argument("--drain-s", type=float, default=30.0, help="after --minutes, how long requests out may take")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--name", default=time.strftime("%Y%m%d-%H%M%S"))
    parser.add_argument("--allow-remote", action="store_true", help="allow non-loopback targets")
    args = parser.parse_args(argv)
    if args.rate is None and args.concurrency is None:
        args.concurrency = 4
    checks = [(args.minutes > 0, "--minutes must be > 0"), (args.sample_s > 0, "--sample-s must be > 0"),
              (args.rate is None or args.rate > 0, "--rate must be > 0"),
              (args.concurrency is None or args.concurrency >= 1, "--concurrency must be >= 1"),
              (args.max_requests >= 1 and args.max_outstanding >= 1, "--max-requests/--max-outstanding must be >= 1"),
              (args.timeout > 0 and args.drain_s >= 0, "--timeout must be > 0 and --drain-s >= 0")]
    for ok, message in checks:
        if not ok:
            parser.error(message)
    return args


def metrics_urls(args: argparse.Namespace) -> list[str]:
    if args.metrics_urls:
        raw = [u for u in args.metrics_urls.split(",") if u.strip()]
    else:
        settings = Settings.from_env()
        raw = [settings.node_address(n).url for n in range(3)]
    return [check_target(u.strip(), args.allow_remote) for u in raw]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        url = check_target(args.url, args.allow_remote)
        urls = metrics_urls(args)
    except (ValueError, ConfigError) as exc:  # ConfigError is a ValueError too
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    run = Run(url, args.minutes, args.max_requests, args.timeout, args.drain_s)
    samples: list[RssSample] = []
    stop = threading.Event()
    watcher = threading.Thread(target=sampler, args=(run, urls, args.sample_s, samples, stop), daemon=True)
    load = open_loop(run, args.rate, args.max_outstanding) if args.rate else closed_loop(run, args.concurrency)
    print(f"soak: {args.minutes:g} min against {url}, RSS of {len(urls)} nodes every {args.sample_s:g}s", flush=True)
    watcher.start()
    for thread in load:
        thread.start()
    for thread in load:
        thread.join(timeout=max(0.0, run.hard_end - time.monotonic()) + JOIN_GRACE_S)
    stop.set()
    watcher.join(timeout=SCRAPE_TIMEOUT_S * len(urls) + JOIN_GRACE_S)
    end = round(min(run.elapsed(), args.minutes * 60.0), 2)  # one last sample, as the load ends
    samples.extend(RssSample(end, u, scrape_rss(requests.Session(), u)) for u in urls)
    with run.lock:
        summary = summarize(run, list(samples), urls, args)
        paths = write_outputs(args.out, args.name, summary, list(samples), run)
    print(json.dumps(summary, indent=2))
    print("soak: wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
