"""The generate benchmark runs end to end on tiny stand-ins and reports what it promises."""
import json

import pytest

from profiling import bench_generate


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
