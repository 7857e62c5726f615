"""The decode-step benchmark (profiling/bench_decode) runs end to end on tiny stand-ins and reports what it
promises."""
import json

import pytest

from tests.helpers import TEST_ENV


@pytest.mark.timeout(600)
def test_bench_decode_times_steps_by_phase_and_profiles(tmp_path, model_source, monkeypatch):
    from profiling import bench_decode
    for name, value in TEST_ENV.items():
        monkeypatch.setenv(name, value)
    assert bench_decode.main(["--sequences", "1,3", "--repeat", "2", "--profile", "--profile-steps", "1",
                              "--top", "5", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench_decode_float32.json").read_text())
    assert {(r["runner"], r["sequences"]) for r in report["rows"]} == {("current", 1), ("current", 3)}
    assert all(r["steps"] == 2 and r["step_ms"] > 0 and set(r["phases_ms"]) == set(bench_decode.PHASES)
               and r["longest_row"] > 100 and len(r["tokens"]) == r["sequences"] for r in report["rows"])
    assert set(report["ratio_most_vs_fewest"]) == {"current: 3 vs 1"}
    assert all(len(p["top_ops"]) == 5 for size in report["profiles"].values() for p in size)


def test_bench_decode_refuses_more_steps_than_an_answer_has():
    from profiling import bench_decode
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--repeat", "127"])
    assert bench_decode.parse_args(["--sequences", "16,1,16"]).sequences == [1, 16]
