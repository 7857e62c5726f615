"""The generate benchmark runs end to end on tiny stand-ins and reports what it promises."""
import argparse
import json

import pytest

from profiling import bench_generate
from tests.helpers import TEST_ENV


@pytest.mark.timeout(600)
def test_bench_generate_reports_all_modes(tmp_path, model_source):
    rc = bench_generate.main(["--requests", "3", "--stagger", "0.05", "--max-batch", "2", "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "bench_generate.json").read_text())
    modes = {r["mode"]: r for r in report["results"]}
    assert set(modes) == {"continuous", "static", "reference"}
    # every mode generated the same number of tokens for the same requests
    assert len({r["tokens"] for r in modes.values()}) == 1 and modes["reference"]["tokens"] > 0
    assert modes["reference"]["dtype"] == "float32"
    assert report["ratio_continuous_vs_static"] > 0 and report["ratio_continuous_vs_reference"] > 0
    assert modes["continuous"]["ttft_after_admission_p95_s"] <= modes["continuous"]["latency_p95_s"]
    assert report["step_times"]["decode_step_s"] > 0 and report["step_times"]["prefill_one_s"] > 0


@pytest.mark.timeout(600)
def test_bench_generate_answer_lengths_end_answers_alike_in_every_mode(tmp_path, model_source):
    rc = bench_generate.main(["--requests", "4", "--stagger", "0.05", "--max-batch", "2",
                              "--answer-lengths", "uniform:2:9", "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "bench_generate.json").read_text())
    lengths = report["settings"]["answer_tokens"]
    assert len(lengths) == 4 and all(2 <= n <= 9 for n in lengths) and len(set(lengths)) > 1
    modes = {r["mode"]: r for r in report["results"]}
    # static batches cut each answer at its own length, continuous stops it there,
    # the reference generates only that much: the same tokens, never more than asked
    assert len({r["tokens"] for r in modes.values()}) == 1
    assert 0 < modes["reference"]["tokens"] <= sum(lengths)


def test_answer_lengths_are_parsed_and_checked():
    assert bench_generate.parse_answer_lengths("128") == (128, 128)
    assert bench_generate.parse_answer_lengths("uniform:32:128") == (32, 128)
    for bad in ("0", "129", "uniform:64:32", "uniform:1", "normal:1:2", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_generate.parse_answer_lengths(bad)
    requests = bench_generate.make_requests(16, (32, 128))
    assert requests == bench_generate.make_requests(16, (32, 128))  # seeded
    assert all(32 <= r.max_new_tokens <= 128 for r in requests)


@pytest.mark.timeout(600)
def test_bench_rerank_compares_one_forward_with_length_groups(tmp_path, model_source, monkeypatch):
    from profiling import bench_rerank
    # The tool reads its settings from the environment: pin the tests' float32, where the
    # scores of one forward and of length groups agree to 1e-4 (bfloat16 only to ~2e-3).
    for name, value in TEST_ENV.items():
        monkeypatch.setenv(name, value)
    assert bench_rerank.main(["--requests", "2", "--rounds", "1", "--pad-ratios", "1.0,1.5",
                              "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench_rerank.json").read_text())
    rows = {row["setting"]: row for row in report["rows"]}
    assert list(rows) == ["one forward", "pad ratio 1.0", "pad ratio 1.5"]
    assert rows["one forward"]["forwards_per_request"] == 1 and rows["one forward"]["speedup"] == 1
    # the support corpus mixes lengths: no padding at all takes several forwards a request
    assert rows["pad ratio 1.0"]["forwards_per_request"] > 1
    assert rows["pad ratio 1.0"]["forwards_per_request"] >= rows["pad ratio 1.5"]["forwards_per_request"] >= 1
    assert all(row["seconds_per_request"] > 0 and row["max_score_diff"] < 1e-4 for row in rows.values())


def test_bench_rerank_refuses_bad_ratios():
    from profiling import bench_rerank
    for bad in ("", "0.9", "x", "1.1,abc"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_rerank.parse_ratios(bad)
    assert bench_rerank.parse_ratios("1,1.25") == [1.0, 1.25]


@pytest.mark.timeout(600)
def test_bench_decode_times_steps_by_phase_against_a_baseline(tmp_path, model_source, monkeypatch):
    from profiling import bench_decode
    for name, value in TEST_ENV.items():
        monkeypatch.setenv(name, value)
    assert bench_decode.main(["--sequences", "1,3", "--repeat", "2", "--profile", "--profile-steps", "1",
                              "--top", "5", "--baseline", "HEAD", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench_decode_float32.json").read_text())
    rows = {(r["runner"], r["sequences"]) for r in report["rows"]}
    assert rows == {(runner, n) for runner in ("baseline@HEAD", "current") for n in (1, 3)}
    assert all(r["steps"] == 2 and r["step_ms"] > 0 and set(r["phases_ms"]) == set(bench_decode.PHASES)
               for r in report["rows"])
    # both runners chose the same tokens for the same prompts, step for step
    assert report["same_tokens_across_runners"] == {"1": True, "3": True}
    assert set(report["ratio_most_vs_fewest"]) == {"baseline@HEAD: 3 vs 1", "current: 3 vs 1"}
    assert all(len(p["top_ops"]) == 5 for size in report["profiles"].values() for p in size)


def test_bench_decode_refuses_more_steps_than_an_answer_has():
    from profiling import bench_decode
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--repeat", "127"])
    assert bench_decode.parse_args(["--sequences", "16,1,16"]).sequences == [1, 16]


@pytest.mark.timeout(600)
def test_bench_rerank_batching_compares_count_and_token_closed_batches(tmp_path, model_source, monkeypatch):
    from profiling import bench_rerank
    for name, value in TEST_ENV.items():
        monkeypatch.setenv(name, value)
    assert bench_rerank.main(["--batching", "--concurrency", "1,3", "--max-batches", "1", "--budgets", "1",
                              "--rounds", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench_rerank.json").read_text())
    rows = {(row["concurrency"], row["setting"]): row for row in report["rows"]}
    assert set(rows) == {(1, "count 1"), (1, "tokens 1"), (3, "count 1"), (3, "tokens 1")}
    # A budget of one token holds no two requests: each runs alone, as with one request a batch.
    assert rows[(3, "count 1")]["batches"] == rows[(3, "tokens 1")]["batches"] == 3
    low, high = report["request_tokens"]["min"], report["request_tokens"]["max"]
    assert 0 < low <= rows[(3, "tokens 1")]["max_batch_tokens"] <= high
    assert all(row["requests_per_s"] > 0 and row["max_latency_s"] >= row["mean_latency_s"] > 0
               for row in rows.values())
