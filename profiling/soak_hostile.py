"""Hostile soak: normal load mixed with hostile requests, slow clients and a node killed and
restarted, on a fresh local cluster. Every request must get an answer its kind allows
(profiling/lib/hostile.py lists them) and no worker may leave the gateway's rotation except
the node that was killed, between its death and its rejoin.

    python -m profiling.soak_hostile [--minutes 10] [--clients 4] [--slow-sockets 40]
        [--hostile-every-s 2] [--duplicate-callers 6] [--near-limit-every 10]
        [--kill-at-s 120] [--out DIR] [--startup-timeout 600]

The cluster takes the caller's environment (data, model source, precision, ...; the demo
data when FAISS_INDEX_PATH is unset) on free loopback ports, and a supervisor like
`./run.sh local`'s restarts the node this tool SIGKILLs. While the load runs, node 0's
/health is sampled: each time a worker's `failures` count grows it left the rotation,
and that is allowed only for node 1 between the kill and its rejoin. At the end, normal
requests must reach node 1 again.

Bounded: nothing is sent after --minutes; requests then out get the request timeout at
most; a slow socket lives at most the node's read timeout plus a margin; every thread is
joined with a timeout. Exit status 0 when every answer was allowed and no worker was
ejected for a request's error, 1 otherwise, 2 for a bad option or configuration.

Writes DIR/summary.json (per kind: sent, statuses, violations, latency; ejections; the
kill and rejoin; peak RSS per node) and DIR/requests.csv (one row per request or socket).
"""
from __future__ import annotations

import argparse
import itertools
import logging
import math
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import requests

from pipeline import spec
from pipeline.config import REPO_ROOT, ConfigError, Settings
from profiling.lib.cli import add_out, make_parser
from profiling.lib.hostile import EMOJI, MALFORMED_FIELD, Outcome, Prober, check_refused, slow_socket
from profiling.lib.prometheus import RSS_METRIC, scrape
from profiling.lib.provenance import local_record
from profiling.lib.report import percentiles, run_folder, write_csv, write_json
from tools.local import RESTART_LIMIT, RESTART_WINDOW_S, LocalCluster, Supervisor, free_ports, pinned_env

log = logging.getLogger("soak_hostile")
DEMO_DIR = REPO_ROOT / "data" / "demo"
WATCH_EVERY_S = 0.5  # node 0's /health: a worker's leave and rejoin are seen within this
RSS_EVERY_S = 5.0
SUPERVISE_EVERY_S = 0.5
JOIN_MARGIN_S = 30.0  # past the last request's timeout, how long threads may take to finish
# After the load, how many normal requests may go by before one must be served by node 1.
REJOIN_PROOF_REQUESTS = 6


# ------------------------------------------------------------------------- the cluster

def cluster_env(env: dict[str, str]) -> dict[str, str]:
    """The caller's environment on three free loopback ports, demo data unless given."""
    out = {k: v for k, v in env.items() if not k.startswith("NODE_")}
    out.update({f"NODE_{n}_IP": f"127.0.0.1:{port}" for n, port in enumerate(free_ports(3))})
    out.setdefault("FAISS_INDEX_PATH", str(DEMO_DIR / "faiss_index.bin"))
    out.setdefault("DOCUMENTS_DIR", str(DEMO_DIR / "documents"))
    return pinned_env(out)


def near_limit_query(settings: Settings, share: float = 0.9) -> tuple[str, int]:
    """A query of about `share` x MAX_QUERY_TOKENS tokens (allowed, and as costly as allowed)."""
    from transformers import AutoTokenizer

    from pipeline.models import resolve_model_source
    tokenizer = AutoTokenizer.from_pretrained(spec.GENERATOR_MODEL, **resolve_model_source(settings).hf_kwargs())
    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    head, goal = "Where is my order? ", int(share * settings.limits.max_query_tokens)
    lo, hi = 0, settings.limits.max_query_tokens  # an emoji is at least one token: hi is too many
    while lo < hi:  # the most emoji that stay within the goal
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(head + EMOJI * mid) <= goal else (lo, mid - 1)
    text = head + EMOJI * lo
    return text, count(text)


# ------------------------------------------------------------------------- the run

@dataclass
class Run:
    """Everything the threads share: the clock, the stop time, and what they recorded."""
    args: argparse.Namespace
    cluster: LocalCluster
    prober: Prober
    t0: float
    stop_at: float
    near_limit: str
    outcomes: list[Outcome] = field(default_factory=list)
    health: list[tuple[float, int, bool, int]] = field(default_factory=list)  # t, node, up, failures
    rss: dict[str, float] = field(default_factory=dict)  # node url -> peak bytes
    kill_s: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    finished: threading.Event = field(default_factory=threading.Event)

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def sending(self) -> bool:
        return time.monotonic() < self.stop_at

    def add(self, *outcomes: Outcome) -> None:
        with self.lock:
            self.outcomes.extend(outcomes)


def normal_client(run: Run, index: int) -> None:
    """Closed loop: a new question (unique text: no cache answers it) as each answer arrives."""
    with requests.Session() as session:
        for n in itertools.count():
            if not run.sending():
                return
            query = f"{spec.REFERENCE_QUERIES[n % len(spec.REFERENCE_QUERIES)]} (ticket {index}-{n})"
            run.add(run.prober.query("normal", f"normal-{index}-{n}", query, session=session))


def hostile_client(run: Run) -> None:
    """One hostile request every --hostile-every-s, cycling through the kinds."""
    args = run.args
    oversized = EMOJI * min(run.cluster.settings.limits.max_query_chars, run.cluster.settings.limits.max_query_tokens)
    kinds = ["oversized", *(f"malformed:{name}" for name in MALFORMED_FIELD), "duplicate"]
    for n in itertools.count():
        if not run.sending():
            return
        if args.near_limit_every and n % args.near_limit_every == args.near_limit_every - 1:
            run.add(run.prober.query("near_limit", f"near-{n}", run.near_limit))
            continue
        kind = kinds[n % len(kinds)]
        if kind == "oversized":
            run.add(run.prober.query("oversized", f"oversized-{n}", oversized, check=check_refused("query")))
        elif kind.startswith("malformed:"):
            run.add(run.prober.malformed(kind.split(":", 1)[1], f"malformed-{n}"))
        else:
            question = f"{spec.REFERENCE_QUERIES[n % len(spec.REFERENCE_QUERIES)]} (shared {n})"
            run.add(*run.prober.duplicates(f"dup-{n}", question, args.duplicate_callers))
            run.add(run.prober.conflict(f"dup-{n}", question + " but different"))
        time.sleep(max(0.0, min(args.hostile_every_s, run.stop_at - time.monotonic())))  # the mix's pace


def slow_client(run: Run, index: int) -> None:
    """Slowloris sockets one after another (headers, then a body, ...) until the load stops."""
    address = run.cluster.settings.node_address(0)
    read_timeout_s = run.cluster.settings.read_timeout_s
    for n in itertools.count():
        if not run.sending():
            return
        kind = "slow_headers" if (index + n) % 2 == 0 else "slow_body"
        started = time.monotonic()
        run.add(slow_socket(kind, address.host, address.port, read_timeout_s, run.t0, index * 100_000 + n))
        # A socket refused at once must not spin: at most one a second per slot.
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))


def killer(run: Run) -> None:
    """SIGKILL node 1 at --kill-at-s; the supervisor thread restarts it."""
    if run.finished.wait(max(0.0, run.args.kill_at_s - run.now_s())) or not run.sending():
        return
    proc = run.cluster.procs.get(1)
    if proc is not None and proc.poll() is None:
        proc.kill()
        run.kill_s = run.now_s()
        log.info("killed node 1 at %.1f s", run.kill_s)


def supervise(run: Run) -> None:
    supervisor = Supervisor(run.cluster, RESTART_LIMIT, RESTART_WINDOW_S)
    while not run.finished.wait(SUPERVISE_EVERY_S):
        supervisor.check()


def watch(run: Run) -> None:
    """Node 0's view of its workers every WATCH_EVERY_S; each node's peak RSS every RSS_EVERY_S."""
    next_rss = 0.0
    while not run.finished.wait(WATCH_EVERY_S):
        t = run.now_s()
        try:
            workers = requests.get(f"{run.cluster.url(0)}/health", timeout=5).json().get("workers", [])
        except (requests.RequestException, ValueError):
            workers = []  # node 0 busy or restarting: the next sample tells
        with run.lock:
            run.health.extend((t, w["node"], bool(w["up"]), int(w["failures"])) for w in workers)
        if t >= next_rss:
            next_rss = t + RSS_EVERY_S
            for node in range(3):
                value = scrape(f"{run.cluster.url(node)}/metrics").get(RSS_METRIC)
                if value is not None:
                    run.rss[run.cluster.url(node)] = max(value, run.rss.get(run.cluster.url(node), 0.0))


def start_threads(run: Run) -> tuple[list[threading.Thread], list[threading.Thread]]:
    """(load threads, background threads); the background ones end when run.finished is set."""
    args = run.args
    load = [threading.Thread(target=normal_client, args=(run, i), name=f"normal-{i}") for i in range(args.clients)]
    load.append(threading.Thread(target=hostile_client, args=(run,), name="hostile"))
    load += [threading.Thread(target=slow_client, args=(run, i), name=f"slow-{i}") for i in range(args.slow_sockets)]
    background = [threading.Thread(target=f, args=(run,), name=f.__name__) for f in (watch, supervise)]
    if args.kill_at_s is not None:
        background.append(threading.Thread(target=killer, args=(run,), name="killer"))
    for thread in (*load, *background):
        thread.daemon = True
        thread.start()
    return load, background


def prove_rejoin(run: Run) -> bool:
    """After the load: node 1 serves normal requests again (round robin reaches it)."""
    for n in range(REJOIN_PROOF_REQUESTS):
        outcome = run.prober.query("normal", f"after-{n}", f"{spec.REFERENCE_QUERIES[n % 8]} (after {n})")
        run.add(outcome)
        if outcome.served_by == "1":
            return True
    return False


def wait_rejoined(run: Run, timeout_s: float) -> float | None:
    """Seconds from the kill until node 0 saw node 1 up again (waiting up to timeout_s for it)."""
    if run.kill_s is None:
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        with run.lock:
            back = rejoined_after(run.health, run.kill_s)
        if back is not None or time.monotonic() >= deadline:
            return back
        time.sleep(WATCH_EVERY_S)  # the watcher's pace: its next sample decides


def rejoined_after(health: list[tuple[float, int, bool, int]], kill_s: float) -> float | None:
    """Seconds from the kill until node 1 was up again in node 0's view, after node 0 had seen it
    down (right after a SIGKILL node 0 still lists it up until a probe or a forward fails)."""
    seen_down = False
    for t, node, up, _failures in sorted(health):
        if node != 1 or t <= kill_s:
            continue
        if not up:
            seen_down = True
        elif seen_down:
            return t - kill_s
    return None


# ------------------------------------------------------------------------- verdict

def ejections(health: list[tuple[float, int, bool, int]]) -> list[tuple[float, int]]:
    """(time, node) of each time a worker's failures count grew: it left the rotation."""
    seen: dict[int, int] = {}
    out = []
    for t, node, _up, failures in health:
        if node in seen and failures > seen[node]:
            out.append((t, node))
        seen[node] = failures
    return out


def unexplained(events: list[tuple[float, int]], kill_s: float | None, rejoin_s: float | None) -> list[tuple[float, int]]:
    """Ejections that the kill does not explain (node 1, from the kill until it was back)."""
    if kill_s is None:
        return list(events)
    until = kill_s + (rejoin_s if rejoin_s is not None else math.inf) + WATCH_EVERY_S
    return [(t, node) for t, node in events if not (node == 1 and kill_s <= t <= until)]


def per_kind(outcomes: list[Outcome]) -> dict[str, dict]:
    table = {}
    for kind in sorted({o.kind for o in outcomes}):
        rows = [o for o in outcomes if o.kind == kind]
        latencies = [o.latency_s for o in rows if not math.isnan(o.latency_s)]
        table[kind] = {
            "sent": len(rows), "statuses": dict(Counter(str(o.status) for o in rows)),
            "violations": sum(1 for o in rows if o.violation),
            "latency_s": dict(zip(("p50", "p95"), (round(v, 2) for v in percentiles(latencies, (50, 95)))))
            if latencies else {},
        }
    return table


def summarize(run: Run, rejoin_s: float | None, rejoined_proof: bool) -> dict:
    events = ejections(run.health)
    bad = unexplained(events, run.kill_s, rejoin_s)
    violations = [o for o in run.outcomes if o.violation]
    return {
        "minutes": run.args.minutes, "ran_s": round(run.now_s(), 1), "args": vars(run.args),
        "settings": {"max_query_tokens": run.cluster.settings.limits.max_query_tokens,
                     "read_timeout_s": run.cluster.settings.read_timeout_s,
                     "request_timeout_s": run.cluster.settings.limits.request_timeout_s,
                     "precision": run.cluster.settings.models.precision,
                     "model_source": run.cluster.env.get("MODEL_SOURCE"),
                     "standin_profile": run.cluster.settings.models.standin_profile},
        "kinds": per_kind(run.outcomes), "requests": len(run.outcomes), "violations": len(violations),
        "violation_examples": [f"{o.kind} {o.request_id}: {o.violation}" for o in violations[:20]],
        "kill_s": run.kill_s, "rejoin_s": rejoin_s, "node_1_served_after_rejoin": rejoined_proof,
        "ejections": [{"t_s": round(t, 1), "node": n} for t, n in events],
        "unexplained_ejections": [{"t_s": round(t, 1), "node": n} for t, n in bad],
        "peak_rss_mib": {url: round(v / 2**20) for url, v in run.rss.items()},
        "provenance": local_record(run.cluster.env),  # the cluster ran with exactly this environment
        "passed": not violations and not bad and (run.kill_s is None or rejoined_proof),
    }


def format_report(summary: dict) -> str:
    lines = [f"{'kind':<14}{'sent':>6}{'violations':>11}{'p50 s':>8}{'p95 s':>8}  statuses",
             "-" * 70]
    for kind, row in summary["kinds"].items():
        lat = row["latency_s"]
        statuses = ", ".join(f"{k}:{v}" for k, v in sorted(row["statuses"].items()))
        lines.append(f"{kind:<14}{row['sent']:>6}{row['violations']:>11}{lat.get('p50', math.nan):>8.2f}"
                     f"{lat.get('p95', math.nan):>8.2f}  {statuses}")
    kill = "no kill" if summary["kill_s"] is None else (
        f"node 1 killed at {summary['kill_s']:.0f} s, back in the rotation after "
        + (f"{summary['rejoin_s']:.1f} s" if summary["rejoin_s"] is not None else "NEVER")
        + f"; served again: {summary['node_1_served_after_rejoin']}")
    lines += ["", kill,
              f"ejections: {len(summary['ejections'])}, unexplained by the kill: {len(summary['unexplained_ejections'])}",
              f"peak RSS MiB: {summary['peak_rss_mib']}",
              f"{summary['requests']} requests/sockets, {summary['violations']} violations: "
              + ("PASSED" if summary["passed"] else "FAILED")]
    lines += [f"  {example}" for example in summary["violation_examples"]]
    return "\n".join(lines)


# ------------------------------------------------------------------------- main

def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.soak_hostile", __doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long to send load")
    p.add_argument("--clients", type=int, default=4, help="normal closed-loop clients")
    p.add_argument("--slow-sockets", type=int, default=40, help="slowloris sockets open at any time")
    p.add_argument("--hostile-every-s", type=float, default=2.0, help="pause between hostile requests")
    p.add_argument("--duplicate-callers", type=int, default=6, help="callers sharing one request_id at once")
    p.add_argument("--near-limit-every", type=int, default=10,
                   help="every Nth hostile request is a query of 90%% of MAX_QUERY_TOKENS (0 = none)")
    p.add_argument("--kill-at-s", type=float, default=120.0, help="when to SIGKILL node 1 (negative = never)")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="per-request timeout in s (0 = the cluster's REQUEST_TIMEOUT_S + 20)")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="how long the cluster may take to start")
    add_out(p, "soak_hostile")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.kill_at_s is not None and args.kill_at_s < 0:
        args.kill_at_s = None
    for ok, message in [(args.minutes > 0, "--minutes must be > 0"), (args.clients >= 1, "--clients must be >= 1"),
                        (args.slow_sockets >= 0, "--slow-sockets must be >= 0"),
                        (args.hostile_every_s > 0, "--hostile-every-s must be > 0"),
                        (args.duplicate_callers >= 2, "--duplicate-callers must be >= 2"),
                        (args.near_limit_every >= 0, "--near-limit-every must be >= 0")]:
        if not ok:
            p.error(message)
    args.out = run_folder("soak_hostile", args.out)
    return args


def soak(args: argparse.Namespace, cluster: LocalCluster) -> tuple[dict, list[Outcome]]:
    near, tokens = near_limit_query(cluster.settings)
    log.info("near-limit query: %d tokens (MAX_QUERY_TOKENS %d)", tokens, cluster.settings.limits.max_query_tokens)
    timeout_s = args.timeout or cluster.settings.limits.request_timeout_s + 20
    t0 = time.monotonic()
    run = Run(args, cluster, Prober(cluster.url(0), timeout_s, t0), t0, t0 + args.minutes * 60, near)
    load, background = start_threads(run)
    for thread in load:
        thread.join(timeout=max(0.0, run.stop_at + timeout_s + JOIN_MARGIN_S - time.monotonic()))
    rejoin_s = wait_rejoined(run, cluster.settings.gateway.health_interval_s + args.startup_timeout)
    proof = prove_rejoin(run) if run.kill_s is not None else False
    run.finished.set()
    for thread in background:
        thread.join(timeout=JOIN_MARGIN_S)
    return summarize(run, rejoin_s, proof), run.outcomes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s soak_hostile %(levelname)s: %(message)s")
    try:
        env = cluster_env(dict(os.environ))
        cluster = LocalCluster(env, args.out / "logs")
        cluster.settings.require_index_files()
        cluster.settings.require_documents()
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    try:
        cluster.start(timeout_s=args.startup_timeout)
        log.info("cluster up at %s; logs in %s", cluster.url(0), cluster.log_dir)
        summary, outcomes = soak(args, cluster)
    finally:
        cluster.stop()
    write_json(args.out / "summary.json", summary)
    write_csv(args.out / "requests.csv", outcomes, list(Outcome.__dataclass_fields__), float_digits=3)
    print(format_report(summary))
    print(f"results in {args.out}")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
