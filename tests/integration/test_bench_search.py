"""profiling.bench_search: /search over HTTP (a real node 2 process) vs in-process faiss."""
import json

import pytest

pytestmark = pytest.mark.slow


def test_bench_search_compares_http_with_in_process(course_data, tmp_path):
    from profiling import bench_search
    assert bench_search.main(["--index", str(course_data.index_path), "--batch", "4", "--rounds", "3",
                              "--threads", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench_search.json").read_text())
    assert report["ntotal"] == 3000 and report["batch"] == 4 and report["mmap"] is True
    assert report["load_s"] > 0 and report["first_batch_s"] > 0 and report["node2_ready_s"] > 0
    assert all(v > 0 for v in report["rss_mib"].values()) and report["node2_rss_mib"]["rss"] > 0
    qps = report["queries_per_s"]
    assert qps["http"] > 0 and qps["in_process"] > 0
    assert report["ratio_http_vs_in_process"] == pytest.approx(qps["http"] / qps["in_process"])
    # What it was measured with: this process's settings, node 2's (or 'unknown' without GET /settings)
    provenance = report["provenance"]
    assert provenance["settings"]["FAISS_THREADS"] and len(provenance["tool"]["commit"]) == 40
    (node2,) = provenance["nodes"]
    assert node2["node"] == 2 and node2["info"]["role"] == "index"
