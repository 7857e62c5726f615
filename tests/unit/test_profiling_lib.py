"""profiling.lib pieces the CLIs share: the comma-list parser, the reply check, and the load
loops (the ones soak.py and loadgen.py run) against a fake node on 127.0.0.1, bounded in count and time."""
from __future__ import annotations

import argparse
import csv
import json
import math
import time

import pytest

from profiling import loadgen, soak
from profiling.lib import cli, load
from tests.fake_node import FakeNode

pytestmark = pytest.mark.timeout(120)


def test_comma_list_ints_sorted_and_unique():
    levels = cli.comma_list(int, minimum=1, sort_unique=True)
    assert levels("8, 2,4,2,,1") == [1, 2, 4, 8]
    for bad in ("", ",", "0,2", "1,x", "1.5", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            levels(bad)


def test_comma_list_floats_keep_their_order():
    ratios = cli.comma_list(float, minimum=1.0)
    assert ratios("1.25,1,1.25") == [1.25, 1.0, 1.25]
    for bad in ("0.9", "nan", "1,abc"):
        with pytest.raises(argparse.ArgumentTypeError):
            ratios(bad)
    assert cli.comma_list(str)("a, b") == ["a", "b"]
    assert cli.split_list(" a,, b ,") == ["a", "b"] and cli.split_list("") == []


def test_every_cli_parses_its_lists_alike():
    args = loadgen.parser().parse_args(["--url", "http://127.0.0.1:1", "--sweep", "4,1,2,2", "--count-per-level", "1"])
    assert args.sweep == [1, 2, 4]
    from profiling import microbench
    assert microbench.parser().parse_args(["--stage", "embed", "--batch-sizes", "32,1,8"]).batch_sizes == [1, 8, 32]
    with pytest.raises(SystemExit):
        loadgen.parser().parse_args(["--url", "http://127.0.0.1:1", "--sweep", "0,1", "--count-per-level", "1"])


def test_reply_error_is_the_contract_check():
    good = {"request_id": "r", "generated_response": "", "sentiment": "positive", "is_toxic": "true"}
    assert load.reply_error(good, "r") == ""
    assert load.reply_error({**good, "is_toxic": "yes"}, "r") == load.INVALID_REPLY
    assert load.reply_error(None, "r") == load.INVALID_REPLY


def _target(node: FakeNode, deadline_s: float = 10.0) -> load.LoadTarget:
    return load.LoadTarget(node.url, ["q"], timeout_s=5, deadline=time.monotonic() + deadline_s)


def test_closed_loop_is_bounded_in_count_and_checks_replies():
    with FakeNode() as node:
        records = load.run_closed(_target(node), load.ClosedGroup("c2", 5, 2))
        assert len(records) == 5 == len(set(node.queries)) and all(r.ok and r.finished for r in records)
    with FakeNode(bad_reply=True) as node:
        records = load.run_closed(_target(node), load.ClosedGroup("c1", 2, 1))
        assert [r.error for r in records] == [load.INVALID_REPLY] * 2 and [r.status for r in records] == [200, 200]


def test_open_loop_stops_sending_at_send_until_and_caps_what_is_out():
    with FakeNode() as node:
        target = _target(node)
        started = time.monotonic()
        records = load.run_open(target, load.OpenGroup("o", 1000, 0.05), send_until=started + 0.5, max_outstanding=2)
        assert time.monotonic() - started < 3
        assert 3 <= len(records) <= 11 and all(r.ok for r in records)
        assert not target.deadline_hit  # a bound the caller chose, not the deadline
    with FakeNode() as node:
        target = _target(node, deadline_s=0.3)
        records = load.run_open(target, load.OpenGroup("o", 100, 0.1))
        assert len(records) <= 4 and target.deadline_hit


@pytest.mark.usefixtures("tool_commit")
def test_soak_runs_the_library_loop_and_writes_its_files(tmp_path):
    with FakeNode() as node:
        started = time.monotonic()
        rc = soak.main(["--url", node.url, "--metrics-urls", node.url, "--minutes", "0.01", "--concurrency", "2",
                        "--sample-s", "0.2", "--drain-s", "2", "--out", str(tmp_path), "--name", "t"])
        assert rc == 0 and time.monotonic() - started < 0.6 + 2 + load.JOIN_GRACE_S
    summary = json.loads((tmp_path / "soak_t.json").read_text())
    assert summary["sent"] == summary["answered"] == summary["ok"] > 0 and summary["errors"] == {}
    assert summary["rss"][node.url]["baseline_mib"] == 100.0 and summary["rss_ok"] is True
    with open(tmp_path / "soak_t_requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["sent_s", "latency_s", "outcome"] and {r["outcome"] for r in rows} == {"ok"}
    with open(tmp_path / "soak_t_rss.csv", newline="") as f:
        assert list(next(csv.DictReader(f))) == ["t_s", "node_url", "rss_bytes"]


@pytest.mark.usefixtures("tool_commit")
def test_soak_open_loop_counts_invalid_replies(tmp_path):
    with FakeNode(bad_reply=True) as node:
        assert soak.main(["--url", node.url, "--metrics-urls", node.url, "--minutes", "0.005", "--rate", "20",
                          "--max-requests", "3", "--sample-s", "0.2", "--out", str(tmp_path), "--name", "r"]) == 0
    summary = json.loads((tmp_path / "soak_r.json").read_text())
    assert summary["sent"] == 3 and summary["errors"] == {"invalid_reply": 3} and summary["ok"] == 0


@pytest.mark.usefixtures("tool_commit")
def test_loadgen_cli_against_a_fake_node(tmp_path):
    with FakeNode() as node:
        rc = loadgen.main(["--url", node.url, "--metrics-urls", f"{node.url}/metrics", "--concurrency", "2",
                           "--count", "4", "--max-duration", "20", "--out", str(tmp_path), "--name", "f",
                           "--no-plots"])
    assert rc == 0
    summary = json.loads((tmp_path / "loadgen_f.json").read_text())
    assert summary["overall"]["ok"] == 4 and summary["health"]["status"] == "healthy"
    assert summary["nodes"][0]["rss_bytes"] == 104857600 and summary["nodes"][0]["stages"] == []
    with open(tmp_path / "loadgen_f.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == load.RequestRecord.columns() and not any(math.isnan(float(r["latency_s"])) for r in rows)


@pytest.mark.parametrize("tool", ["soak", "latency_breakdown", "loadgen"])
def test_every_scraping_tool_stops_naming_a_node_it_cannot_scrape(tool, tmp_path, capsys):
    from profiling import latency_breakdown
    from tools.local import free_ports
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    with FakeNode() as node:
        if tool == "soak":
            rc = soak.main(["--url", node.url, "--metrics-urls", f"{node.url},{dead}", "--minutes", "0.01",
                            "--out", str(tmp_path)])
        elif tool == "latency_breakdown":
            rc = latency_breakdown.main(["--url", node.url, "--metrics", f"0={node.url},1={dead}", "--out",
                                         str(tmp_path)])
        else:
            rc = loadgen.main(["--url", node.url, "--metrics-urls", f"{node.url}/metrics,{dead}/metrics",
                               "--concurrency", "1", "--count", "1", "--out", str(tmp_path)])
        assert node.queries == []  # refused before any load
    assert rc == 1
    assert f"node 1 ({dead}/metrics): ConnectionError" in capsys.readouterr().err
