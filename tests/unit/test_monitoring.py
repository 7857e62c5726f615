"""The dashboard and the alerts take any job name: deploy/grafana/rag-service.json selects by its
`job`, `namespace` and `pod` variables (none hard-coded), and each of its queries, filled in as Grafana
fills them, returns data for a job of that name and none for another (promtool, two job names); the
alert rules' promtool unit tests (deploy/prometheus/rag-alerts.test.yml) pass, and they fail on the
rules as they were (503s counted on /query alone), so they do test the /v1 alerts.

promtool is a process: those tests are slow, and skip where it is not installed
(deploy/install-test-tools.sh installs it). The dashboard against a real cluster and Prometheus:
tests/integration/test_prometheus.py."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline.config import REPO_ROOT

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "rag-service.json"
RULES = REPO_ROOT / "deploy" / "prometheus" / "rag-alerts.rules.yml"
RULE_TESTS = REPO_ROOT / "deploy" / "prometheus" / "rag-alerts.test.yml"
VARIABLES = ("job", "namespace", "pod")
# A selector: a metric name and its braces (every query here names its metric).
SELECTOR = re.compile(r"\b([a-z_:][a-z0-9_:]*)\{([^}]*)\}")
SLOW = pytest.mark.slow  # runs promtool


def queries() -> dict[str, str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {f"{p['title']} / {t.get('refId')}": t["expr"] for p in panels for t in p.get("targets", []) if t.get("expr")}


def variables() -> dict[str, dict]:
    return {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}


def fill(expr: str, job: str) -> str:
    """The query as Grafana sends it: one job chosen, every namespace and pod ("All": .*), and
    $__rate_interval at four 1-minute scrapes or more."""
    assert re.fullmatch(r"[\w/-]+", job)  # no regex metacharacter, which Grafana would escape
    values = {"job": job, "namespace": ".*", "pod": ".*", "__rate_interval": "5m"}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m[1]], expr)


def test_every_query_selects_by_the_three_variables_and_no_job_name():
    text = DASHBOARD.read_text()
    assert 'job="' not in text and len(queries()) >= 30
    for what, expr in queries().items():
        selectors = SELECTOR.findall(expr)
        assert selectors, what
        for metric, matchers in selectors:
            for name in VARIABLES:
                assert f'{name}=~"${name}"' in matchers, (what, metric)
    defined = variables()
    for name in VARIABLES:
        query = defined[name]["query"]["query"]
        assert query.startswith("label_values(rag_node_info") and query.endswith(f", {name})"), name
    # All namespaces and pods: `.*`, which also matches the lab machines' series that have no such label.
    assert defined["namespace"]["allValue"] == defined["pod"]["allValue"] == ".*"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (deploy/install-test-tools.sh installs it)")
    return path


# Label values for every label a query matches or groups by; a histogram's buckets get `le`.
LABELS = {"namespace": "rag", "pod": "rag-worker-0", "instance": "10.0.0.1:8000", "endpoint": "/query",
          "status": "503", "stage": "embed", "worker": "w1", "local": "false", "reason": "busy", "cache": "reply",
          "node": "1", "role": "worker"}


def input_series(job: str) -> list[dict]:
    """A series of each metric the dashboard reads, in `job`, rising one a minute."""
    names = sorted({metric for expr in queries().values() for metric, _ in SELECTOR.findall(expr)})
    series = []
    for name in names:
        labels = {**LABELS, "job": job}
        for le in (["1", "+Inf"] if name.endswith("_bucket") else [None]):
            text = ", ".join(f'{k}="{v}"' for k, v in {**labels, **({"le": le} if le else {})}.items())
            series.append({"series": f"{name}{{{text}}}", "values": "1+1x20"})
    return series


@SLOW
@pytest.mark.parametrize("job", ["rag", "rag/rag-worker"])
def test_each_query_returns_data_for_the_job_chosen_and_none_for_another(job, tmp_path):
    tests = []
    for chosen, expected in ((job, [{"labels": "{}", "value": 1}]), ("another-job", [])):
        exprs = [{"expr": f"clamp(count({fill(expr, chosen)}), 1, 1)", "eval_time": "10m", "exp_samples": expected}
                 for expr in queries().values()]
        tests.append({"interval": "1m", "input_series": input_series(job), "promql_expr_test": exprs})
    path = tmp_path / "dashboard.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}))
    result = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def run_rule_tests(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), "test", "rules", str(folder / RULE_TESTS.name)],
                          capture_output=True, text=True, timeout=120, cwd=folder)


@SLOW
def test_the_alert_rules_unit_tests_pass_and_fire_on_v1_503s(tmp_path):
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [RULES.name]
    v1 = [t for t in tests["tests"] if any('endpoint="/v1/' in s["series"] and 'status="503"' in s["series"]
                                          for s in t["input_series"])]
    assert [a["alertname"] for t in v1 for a in t["alert_rule_test"] if a["exp_alerts"]] == ["RagHigh503Rate"]
    result = run_rule_tests(RULE_TESTS.parent)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    # The rules as they were, on /query alone: the /v1 tests fail.
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    (tmp_path / RULES.name).write_text(RULES.read_text().replace('endpoint=~"/query|/v1/.+"', 'endpoint="/query"'))
    result = run_rule_tests(tmp_path)
    assert result.returncode != 0 and "alertname: RagHigh503Rate" in result.stdout + result.stderr, result.stdout
