"""profiling.design_scale at a tiny count: each kind built, served by an index node process, measured; the
later kind tuned to the first's recall; the time budget skips what would not fit."""
from __future__ import annotations

import json
import time

import pytest

from profiling import design_scale


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_kind_is_built_served_and_measured(tmp_path, capsys):
    assert design_scale.main(["--count", "20000", "--dim", "64", "--queries", "100", "--repeat", "4",
                              "--batches", "1,8", "--index", "IVF,Flat", "--index", "IVF,SQ8",
                              "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "design_scale.json").read_text())
    flat, sq8 = report["rows"]
    assert (flat["spec"], flat["nprobe"], flat["tuned_to"]) == ("IVF512,Flat", 64, None)
    assert flat["recall"] > 0.9  # mixture vectors: uniform ones give about half this at nprobe 64 of 512
    assert sq8["spec"] == "IVF512,SQ8" and sq8["tuned_to"] == pytest.approx(flat["recall"] - 0.01)
    assert sq8["build_recall"] >= sq8["tuned_to"] and sq8["disk_bytes"] < flat["disk_bytes"] / 2
    for row in (flat, sq8):
        assert row["memory_serving"]["rss"] >= row["memory_serving"]["anon"] > 0
        assert all(row["latency"][b]["p99_ms"] >= row["latency"][b]["p50_ms"] > 0 for b in ("b1", "b8"))
        assert row["latency"]["b1"]["calls"] == 4
    assert not [p for p in (tmp_path / "versions").iterdir() if p.is_dir()]  # each kind removed once measured (its node log kept)
    assert "IVF512,SQ8" in capsys.readouterr().out


def test_a_budget_short_of_one_build_refuses_before_drawing_anything(tmp_path, capsys):
    assert design_scale.main(["--count", "4600000", "--dim", "768", "--time-budget", "60", "--work", str(tmp_path),
                              "--out", str(tmp_path / "out"), "--index", "IVF,Flat"]) == 2
    err = capsys.readouterr().err  # refused for the time, or (a full disk) for the space: before any draw
    assert "short of the exact search and one build" in err or "GB free" in err


@pytest.mark.slow
def test_kinds_past_the_budget_are_skipped(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(design_scale, "build_estimate_s", lambda *args: 0.0)  # let the run past the first check
    real_run = design_scale.run_kind

    def slow_run(*args):
        time.sleep(2)  # past the whole budget: the next kind must be skipped
        return real_run(*args)

    monkeypatch.setattr(design_scale, "run_kind", slow_run)
    assert design_scale.main(["--count", "3000", "--dim", "16", "--queries", "20", "--repeat", "2", "--batches", "1",
                              "--index", "IVF,Flat", "--index", "IVF,SQ8", "--time-budget", "1",
                              "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "design_scale.json").read_text())["rows"]
    assert "skipped" not in rows[0] and "would pass --time-budget" in rows[1]["skipped"]
