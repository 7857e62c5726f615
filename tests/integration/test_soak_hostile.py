"""The hostile soak tool end to end on real processes (tiny stand-ins, 127.0.0.1): normal load,
hostile requests, slow sockets and node 1 SIGKILLed mid-run and restarted by the supervisor.
It must answer every request as its kind allows, explain every ejection by the kill, and
write its results."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.config import REPO_ROOT
from tests.helpers import cluster_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_a_short_hostile_soak_with_a_node_killed_passes_and_records_every_kind(course_data, tmp_path):
    out = tmp_path / "soak"
    env = cluster_env(course_data, REQUEST_TIMEOUT_S="60")
    result = subprocess.run(
        [sys.executable, "-m", "profiling.soak_hostile", "--minutes", "0.6", "--clients", "2", "--slow-sockets", "4",
         "--hostile-every-s", "0.5", "--near-limit-every", "5", "--kill-at-s", "8", "--out", str(out)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] and summary["violations"] == 0
    kinds = summary["kinds"]
    assert {"normal", "oversized", "malformed", "duplicate", "conflict", "near_limit", "slow_headers",
            "slow_body"} <= set(kinds)
    assert kinds["oversized"]["statuses"] == {"400": kinds["oversized"]["sent"]}
    assert kinds["conflict"]["statuses"] == {"409": kinds["conflict"]["sent"]}
    # The kill happened, was seen (node 1 left the rotation), and node 1 came back and served.
    assert summary["kill_s"] is not None and summary["rejoin_s"] is not None
    assert summary["ejections"] and not summary["unexplained_ejections"]
    assert summary["node_1_served_after_rejoin"]
    rows = (out / "requests.csv").read_text().splitlines()
    assert len(rows) == summary["requests"] + 1
    assert "PASSED" in result.stdout
    # What it ran with: the cluster's environment and this code's commit
    provenance = summary["provenance"]
    assert provenance["settings"]["REQUEST_TIMEOUT_S"] == "60" and len(provenance["tool"]["commit"]) == 40
