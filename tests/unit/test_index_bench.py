"""profiling.index_bench at a small size: every kind's rows, figures that are measured, the JSON and plot (kept
as each kind finishes), --auto's pick built."""
from __future__ import annotations

import json
from functools import partial

import pytest

from builders.data import build_course, course_vector_batches
from builders.recall import RecallOptions, exact_top_k, sample_queries
from pipeline.data_version import load_version
from profiling import index_bench


def test_index_bench_reports_each_kind_and_parameter(tmp_path, capsys):
    assert index_bench.main(["--docs", "1200", "--index", "IVF,Flat", "--index", "HNSW8,Flat", "--nprobe", "1,30",
                             "--ef-search", "16,64", "--batches", "1,8", "--repeat", "2", "--queries", "40",
                             "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "index_bench.json").read_text())
    rows = report["rows"]
    assert [(r["spec"], r.get("nprobe"), r.get("ef_search")) for r in rows] == [
        ("IVF30,Flat", 1, None), ("IVF30,Flat", 30, None), ("HNSW8,Flat", None, 16), ("HNSW8,Flat", None, 64)]
    assert rows[1]["recall"] == 1.0 > rows[0]["recall"]  # every list probed: exact
    assert all(r["p50_ms_b1"] > 0 and r["p99_ms_b8"] >= r["p50_ms_b8"] and r["disk_mb"] > 0 for r in rows)
    assert (tmp_path / "index_bench.png").stat().st_size > 0
    assert "IVF30,Flat" in capsys.readouterr().out


def test_mixture_vectors_are_benchmarked_at_the_width_asked_and_ivf_finds_their_neighbours(tmp_path):
    # measured at this size: recall@10 0.75 (mixture) against 0.41 (uniform) at nprobe 4 of 205 lists
    recalls = {}
    for vectors in ("uniform", "mixture"):
        out = tmp_path / vectors
        assert index_bench.main(["--docs", "8000", "--vectors", vectors, "--dim", "32", "--index", "IVF,Flat",
                                 "--nprobe", "4", "--batches", "1", "--repeat", "2", "--queries", "100",
                                 "--out", str(out)]) == 0
        report = json.loads((out / "index_bench.json").read_text())
        assert (report["vectors"], report["dim"]) == (vectors, 32)
        recalls[vectors] = report["rows"][0]["recall"]
    assert recalls["mixture"] > 0.6 > 0.5 > recalls["uniform"], recalls


def _rows_by_spec(rows):
    return {spec: [r for r in rows if r["spec"] == spec] for spec in dict.fromkeys(r["spec"] for r in rows)}


def test_auto_builds_what_the_rule_picks_from_the_rows_measured(tmp_path):
    floor = 0.9
    assert index_bench.main(["--docs", "3000", "--vectors", "mixture", "--dim", "32", "--index", "IVF,Flat",
                             "--index", "IVF,SQ8", "--index", "HNSW8,Flat", "--nprobe", "2,76", "--ef-search", "16,256",
                             "--batches", "1,32", "--repeat", "2", "--queries", "60", "--min-recall", str(floor),
                             "--latency-budget-ms", "10000", "--auto", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "index_bench.json").read_text())
    by_spec = _rows_by_spec(report["rows"])
    # the rule, applied here by hand to the rows: per kind its least parameter meeting the floor, then least bytes
    fit = {spec: next(r for r in rows if r["recall"] >= floor) for spec, rows in by_spec.items()}
    expected = min(fit, key=lambda spec: fit[spec]["disk_bytes"])
    auto = report["auto"]
    assert auto["chosen"] == expected
    assert [(c["spec"], c["recall"], c["bytes"]) for c in auto["candidates"]] == [
        (spec, r["recall"], r["disk_bytes"]) for spec, r in fit.items()]
    manifest = load_version(tmp_path / "auto")  # a real build of the pick, its record in its manifest
    assert manifest.index["spec"] == expected == manifest.index["auto"]["chosen"]
    assert manifest.index["auto"]["rule"].startswith("least bytes") and manifest.index["recall"]["overall"] >= floor
    assert manifest.index["nprobe"] <= fit[expected]["nprobe"]  # tuned: at most the measured nprobe
    # the SQ8 build reused IVF-Flat's k-means, and its build time counts it
    flat, sq8 = by_spec["IVF76,Flat"][0], by_spec["IVF76,SQ8"][0]
    assert flat["train_reused_s"] == 0 < sq8["train_reused_s"] <= sq8["build_s"]


def test_a_run_stopped_after_its_first_kind_keeps_that_kinds_rows(tmp_path, monkeypatch):
    measure = index_bench.bench_kind

    def stopped_at_the_second(spec, *args):
        if spec != "IVF,Flat":
            raise KeyboardInterrupt  # as a bounded run's timeout or ^C stops it
        return measure(spec, *args)

    monkeypatch.setattr(index_bench, "bench_kind", stopped_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        index_bench.main(["--docs", "1200", "--index", "IVF,Flat", "--index", "HNSW8,Flat", "--nprobe", "1,30",
                          "--batches", "1", "--repeat", "2", "--queries", "40", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "index_bench.json").read_text())
    assert [(r["spec"], r["nprobe"]) for r in report["rows"]] == [("IVF30,Flat", 1), ("IVF30,Flat", 30)]
    assert (tmp_path / "index_bench.png").stat().st_size > 0


def test_a_bad_spec_is_refused_before_any_build(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        index_bench.main(["--docs", "1200", "--dim", "32", "--index", "IVF,Flat", "--index", "IVF,PQ5",
                          "--out", str(tmp_path)])
    assert exit_.value.code == 2 and not list(tmp_path.glob("build-*"))


def test_a_build_given_the_bench_reference_records_the_recall_it_measures_itself(tmp_path):
    vectors = partial(course_vector_batches, 3000, 32, 0, source="mixture")
    queries = sample_queries(vectors, 3000, 80, seed=0)
    reference = (queries, exact_top_k(queries.vectors, vectors))
    recalls = []
    for name, given in (("own", None), ("given", reference)):
        result = build_course(tmp_path / name, 3000, index="IVF,SQ8", nprobe=3, progress=False, vectors="mixture",
                              dim=32, recall=RecallOptions(accept_low=True, queries=80, reference=given))
        recalls.append(result.manifest.index["recall"])
    assert recalls[0] == recalls[1] and 0 < recalls[0]["overall"] < 1  # nprobe 3 of 76 lists: not exhaustive


def test_search_latencies_take_the_batches_in_turn_and_stop_past_the_deadline_after_two():
    import time

    import numpy as np

    from profiling.lib.index_node import search_latencies_ms
    queries = np.arange(10)[:, None]
    firsts: list[int] = []
    times = search_latencies_ms(lambda q: firsts.append(int(q[0, 0])) or len(q), queries, 3, 5)
    assert firsts == [0, 3, 6, 2, 5] and len(times) == 5 and all(ms >= 0 for ms in times)
    firsts.clear()
    assert len(search_latencies_ms(lambda q: firsts.append(len(q)), queries, 3, 5, time.monotonic() - 1)) == 2
    assert firsts == [3, 3]
