"""deploy/ against a real Prometheus: the committed config and rules pass promtool, and every PromQL
expression of the Grafana dashboard(s) and the alert rules returns data scraped from a real cluster.

The expressions are read from the committed files, so a new panel or rule is tested without
touching this file. Conventions (also in deploy/README.md):

- Dashboards: Grafana's `$__rate_interval` is replaced by RATE_WINDOW, `$job`, `$namespace` and
  `$pod` by DASHBOARD_VARIABLES; any other `$variable`
  left in an expression fails the test (teach `dashboard_expressions` its value first).
- Alert rules: an expr of the form `signal OP constant` is empty while all is well, so the
  test queries the signal, i.e. the expr with one trailing comparison against a number
  stripped (`up{job="rag"} == 0` -> `up{job="rag"}`). An expr without one is queried as is.
- "Returns data": a non-empty result with at least one value that is not NaN (a quantile or a
  ratio over a window in which nothing happened is NaN, which a dashboard shows as no data).

The cluster (the shared one: the expressions are rates inside the window of this test's own
Prometheus, whatever the counters held before) serves two rounds of queries, each with a Prometheus
scrape of all three nodes after it (waited for on the scrape timestamps, not slept), so every
counter has moved between two samples inside the rate window: round 1 creates the label sets that
appear on first use (/query's statuses, a 503 from the gateway's admission) and round 2 makes them
all move again.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import yaml

from pipeline.config import REPO_ROOT
from tests.helpers import uid
from tools.local import die_with_parent, free_ports

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not (PROMETHEUS and PROMTOOL),
                       reason="prometheus/promtool not found on PATH (deploy/install-test-tools.sh installs "
                              "Debian's 'prometheus' package when run as root with apt-get)"),
]

DEPLOY = REPO_ROOT / "deploy"
TEMPLATE = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARDS = sorted((DEPLOY / "grafana").glob("*.json"))
JOB = "rag"  # the scrape job the dashboard and rules select
# What $__rate_interval becomes: Grafana makes it at least four scrape intervals; with the test's
# 1 s scrapes a minute holds the whole of both rounds (see the module docstring).
RATE_WINDOW = "1m"
DASHBOARD_VARIABLES = {"job": JOB, "namespace": ".*", "pod": ".*"}  # "All" namespaces and pods: ".*"
SCRAPE = "1s"
# A trailing comparison against a number, as alert exprs end (`> 0.05`, `== 0`, `> bool 1e3`).
TRAILING_COMPARISON = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*(bool\s+)?[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")
QUERY = "How do I return an item?"


# ------------------------------------------------------------------ the committed files

def rule_files() -> list[Path]:
    """The rule files the template loads, resolved as Prometheus does (relative to the config)."""
    config = yaml.safe_load(TEMPLATE.read_text())
    return [(TEMPLATE.parent / name).resolve() for name in config.get("rule_files", [])]


def alert_rules() -> list[dict]:
    return [rule for path in rule_files() for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


def signal(expr: str) -> str:
    """The expr without one trailing comparison against a constant (the module docstring's convention)."""
    return TRAILING_COMPARISON.sub("", expr.strip(), count=1)


def panel_targets(panels: list[dict]):
    for panel in panels:
        yield from ((panel, target) for target in panel.get("targets", []) if target.get("expr"))
        yield from panel_targets(panel.get("panels", []))  # a row's panels


def dashboard_expressions() -> dict[str, str]:
    """Every panel query of every dashboard, with $__rate_interval replaced; {what: expr}."""
    found = {}
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel, target in panel_targets(dashboard["panels"]):
            expr = target["expr"].replace("${__rate_interval}", RATE_WINDOW).replace("$__rate_interval", RATE_WINDOW)
            # The dashboard's variables as Grafana fills them here: this job, every namespace and pod.
            for name, value in DASHBOARD_VARIABLES.items():
                expr = expr.replace(f"${name}", value)
            what = f"{path.name}: panel {panel['title']!r} query {target.get('refId')}"
            assert "$" not in expr, f"{what} uses a variable this test cannot fill: {expr}"
            found[what] = expr
    return found


def every_expression() -> dict[str, str]:
    exprs = dashboard_expressions()
    exprs.update({f"rule {rule.get('alert') or rule.get('record')}": signal(rule["expr"]) for rule in alert_rules()})
    return exprs


def promtool(*args: str) -> None:
    done = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{done.stdout}{done.stderr}"


def test_the_committed_config_rules_and_dashboard_are_well_formed():
    promtool("check", "config", str(TEMPLATE))  # also checks the rule files it names
    files = rule_files()
    assert files, "the template loads no rule files"
    for path in files:
        promtool("check", "rules", str(path))
    # A rule file nobody loads would never be tested nor evaluated.
    assert set(files) >= set((DEPLOY / "prometheus").glob("*.rules.yml"))
    assert DASHBOARDS, "no dashboard under deploy/grafana"
    exprs = every_expression()
    assert len(exprs) >= len(alert_rules()) + len(DASHBOARDS)
    for path in DASHBOARDS:
        ids = [panel["id"] for panel in json.loads(path.read_text())["panels"]]
        assert len(ids) == len(set(ids)), f"{path.name}: panel ids repeat"
    assert signal('up{job="rag"} == 0') == 'up{job="rag"}'
    assert signal("a / b > 0.05") == "a / b" and signal("x > bool 1e3") == "x" and signal("rate(x[5m])") == "rate(x[5m])"


# ------------------------------------------------------------------ a real Prometheus

def generated_config(cluster, listen: str, rules: list[Path]) -> dict:
    """The template with the cluster's addresses, 1 s scrapes and evaluations, and absolute rule paths."""
    text = TEMPLATE.read_text()
    for node in (0, 1, 2):
        text = text.replace(f"NODE_{node}_IP", cluster.url(node).removeprefix("http://"))
    text = text.replace("localhost:9090", listen)  # Prometheus's own job scrapes this test's server
    config = yaml.safe_load(text)
    config["global"].update(scrape_interval=SCRAPE, evaluation_interval=SCRAPE)
    for job in config["scrape_configs"]:
        job.update(scrape_interval=SCRAPE, scrape_timeout=SCRAPE)  # a timeout may not exceed the interval
        for static in job.get("static_configs", []):
            assert all(t.startswith("127.0.0.1:") for t in static["targets"]), static
    config["rule_files"] = [str(path) for path in rules]
    return config


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params) -> dict:
        reply = requests.get(f"{self.url}{path}", params=params, timeout=10)
        reply.raise_for_status()
        body = reply.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return data["result"]

    def wait_scraped_since(self, since: float, timeout_s: float = 30) -> None:
        """Every node of the job scraped successfully by a scrape that started after `since` (unix time)."""
        deadline = time.monotonic() + timeout_s
        while True:
            # timestamp() of a plain selector is the sample's (the scrape's start); of an expression
            # such as `up == 1` it is the evaluation time, which is always after `since`.
            stamps = [float(s["value"][1]) for s in self.query(f'timestamp(up{{job="{JOB}"}})')]
            up = [s["value"][1] for s in self.query(f'up{{job="{JOB}"}}')]
            if len(stamps) == 3 and min(stamps) > since and up == ["1"] * 3:
                return
            if time.monotonic() > deadline:
                targets = self.get("/api/v1/targets")["activeTargets"]
                pytest.fail(f"not every node scraped since {since}: {stamps}; targets: "
                            + "; ".join(f"{t['scrapeUrl']} {t['health']} {t['lastError']}" for t in targets))
            time.sleep(0.2)


@pytest.fixture
def prometheus(cluster, tmp_path):
    listen = f"127.0.0.1:{free_ports(1)[0]}"
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(generated_config(cluster, listen, rule_files())))
    promtool("check", "config", str(config))
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address={listen}"], cwd=tmp_path, stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"prometheus exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                if requests.get(f"http://{listen}/-/ready", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, f"prometheus not ready in 60 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        yield Prometheus(f"http://{listen}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def cluster(shared_cluster):
    return shared_cluster


def ask(cluster, request_id: str) -> requests.Response:
    return requests.post(f"{cluster.url(0)}/query", json={"request_id": request_id, "query": QUERY}, timeout=120)


def serve_on_both_workers(cluster, prefix: str) -> list[str]:
    """New requests until each worker has answered one (round robin: two, unless one was refused)."""
    served, ids = set(), []
    for n in range(6):
        reply = ask(cluster, f"{prefix}-{n}")
        if reply.status_code == 200:
            served.add(reply.json()["served_by"])
            ids.append(f"{prefix}-{n}")
        if served == {0, 1}:
            return ids
    pytest.fail(f"in 6 requests only workers {sorted(served)} answered")


def refused_beyond_the_joiner_cap(cluster) -> None:
    """Callers of one request_id all at once: one computes it, GATEWAY_MAX_JOINERS_PER_ID wait on it
    and get its 200, and the gateway's admission answers those beyond with 503 at once."""
    callers = cluster.settings.gateway.max_joiners_per_id + 8
    for attempt in range(3):
        request_id, barrier = uid(f"held{attempt}"), threading.Barrier(callers)

        def call(_, request_id=request_id, barrier=barrier) -> int:
            barrier.wait(timeout=30)
            return ask(cluster, request_id).status_code

        with ThreadPoolExecutor(callers) as pool:
            statuses = list(pool.map(call, range(callers)))
        assert 200 in statuses and set(statuses) <= {200, 503}, statuses
        if 503 in statuses:
            return
    pytest.fail("no 503 in 3 tries: the callers never overlapped the computation")


def test_every_dashboard_and_alert_expression_returns_data(cluster, prometheus):
    prometheus.wait_scraped_since(time.time())
    # Round 1: every label set that appears on first use (statuses, both workers, a 503).
    refused_beyond_the_joiner_cap(cluster)
    first = serve_on_both_workers(cluster, uid("round1"))
    prometheus.wait_scraped_since(time.time())
    # Round 2: everything moves again (new requests on both workers, and a repeated id answered
    # from the gateway's idempotency cache: a cache hit).
    serve_on_both_workers(cluster, uid("round2"))
    assert ask(cluster, first[0]).status_code == 200
    prometheus.wait_scraped_since(time.time())

    no_data = {}
    for what, expr in every_expression().items():
        result = prometheus.query(expr)
        if not any(not math.isnan(float(sample["value"][1])) for sample in result):
            no_data[what] = (expr, result)
    assert not no_data, "expressions without data:\n" + "\n".join(f"{w}: {e}\n  -> {r}" for w, (e, r) in no_data.items())

    # Prometheus loaded every rule and evaluates it without error (bounded: 1 s evaluations).
    names = {rule.get("alert") or rule.get("record") for rule in alert_rules()}
    deadline = time.monotonic() + 30
    while True:
        loaded = {rule["name"]: rule for group in prometheus.get("/api/v1/rules")["groups"] for rule in group["rules"]}
        if set(loaded) >= names and all(loaded[n]["health"] != "unknown" for n in names):
            break
        assert time.monotonic() < deadline, f"rules not all evaluated in 30 s: {sorted(loaded)}"
        time.sleep(0.2)
    assert {n: loaded[n]["health"] for n in names} == {n: "ok" for n in names}, \
        {n: loaded[n].get("lastError") for n in names}
