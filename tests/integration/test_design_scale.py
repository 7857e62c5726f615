"""profiling.design_scale at a tiny count: the first kind built, served by an index node process at each swept
nprobe, measured; the later kind tuned on its ladder to the floor the sweep reached; the plot beside the report;
the time budget skips what would not fit."""
from __future__ import annotations

import json

import pytest

from profiling import design_scale


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_first_kind_is_swept_and_the_later_tuned_to_the_floor_it_reached(tmp_path, capsys):
    assert design_scale.main(["--count", "20000", "--dim", "64", "--queries", "100", "--repeat", "4",
                              "--batches", "1,8", "--nprobe", "64,8,32", "--min-recall", "0.95",
                              "--index", "IVF,Flat", "--index", "IVF,SQ8", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "design_scale.json").read_text())
    *swept, tuned = report["rows"]
    # one node per nprobe, each serving the nprobe asked (its /health), in increasing order
    assert [(r["spec"], r["role"], r["nprobe"]) for r in swept] == [("IVF512,Flat", "sweep", p) for p in (8, 32, 64)]
    recalls = [r["recall"] for r in swept]
    assert recalls == sorted(recalls) and recalls[0] < 0.95 <= recalls[-1]  # more lists probed find more
    reached = min(r["nprobe"] for r in swept if r["recall"] >= 0.95)
    assert (report["floor"], report["floor_reached_at_nprobe"], report["tuned_to"]) == (0.95, reached, 0.95)
    # the ladder starts where the sweep met the floor and doubles until the compressed kind meets it too
    assert (tuned["spec"], tuned["role"], tuned["tuned_to"]) == ("IVF512,SQ8", "tuned", 0.95)
    rungs = tuned["ladder"]
    assert [rung["nprobe"] for rung in rungs] == [min(reached * 2 ** i, 512) for i in range(len(rungs))]
    assert all(rung["recall"] < 0.95 for rung in rungs[:-1])
    assert (tuned["nprobe"], tuned["recall"]) == (rungs[-1]["nprobe"], rungs[-1]["recall"])
    assert tuned["recall"] >= 0.95 or tuned["nprobe"] == 512
    assert tuned["disk_bytes"] < swept[0]["disk_bytes"] / 2
    for row in report["rows"]:
        assert row["build_recall_queries"] == 100 and 0 < row["build_recall"] <= 1
        assert row["memory_serving"]["rss"] >= row["memory_serving"]["anon"] > 0
        assert all(row["latency"][b]["p99_ms"] >= row["latency"][b]["p50_ms"] > 0 for b in ("b1", "b8"))
        assert row["latency"]["b1"]["calls"] == 4
    assert (tmp_path / "design_scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in (tmp_path / "versions").iterdir() if p.is_dir()]  # each kind removed once measured (its node log kept)
    out = capsys.readouterr().out
    assert "floor 0.95 met from nprobe" in out and "IVF512,SQ8 tuned to 0.95: nprobe" in out


def test_a_budget_short_of_one_build_refuses_before_drawing_anything(tmp_path, capsys):
    assert design_scale.main(["--count", "4600000", "--dim", "768", "--time-budget", "60", "--work", str(tmp_path),
                              "--out", str(tmp_path / "out"), "--index", "IVF,Flat"]) == 2
    err = capsys.readouterr().err  # refused for the time, or (a full disk) for the space: before any draw
    assert "short of the exact search and one build" in err or "GB free" in err


def test_a_kind_without_nprobe_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        design_scale.main(["--count", "3000", "--index", "HNSW32,Flat", "--out", str(tmp_path)])
    assert "IVF kind" in capsys.readouterr().err


@pytest.mark.slow
def test_kinds_past_the_budget_are_skipped(tmp_path, capsys, monkeypatch):
    real_run = design_scale.run_kind

    def run_then_grow_the_estimate(spec, position, args, *rest):
        rows = real_run(spec, position, args, *rest)
        args.build_estimate_s = 10.0 ** 6  # what is left of the budget no longer holds the next build
        return rows

    monkeypatch.setattr(design_scale, "run_kind", run_then_grow_the_estimate)
    assert design_scale.main(["--count", "3000", "--dim", "16", "--queries", "20", "--repeat", "2", "--batches", "1",
                              "--nprobe", "8", "--index", "IVF,Flat", "--index", "IVF,SQ8", "--time-budget", "600",
                              "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "design_scale.json").read_text())["rows"]
    assert [r["role"] for r in rows[:-1]] == ["sweep"] and "would pass --time-budget" in rows[-1]["skipped"]
    assert "IVF,SQ8: skipped" in capsys.readouterr().out
