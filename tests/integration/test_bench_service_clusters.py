"""profiling.bench_service: one small comparison on real local clusters."""
from __future__ import annotations

import json

import pytest

from profiling import bench_service
from tests.helpers import TEST_ENV, data_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_cache_comparison_on_real_clusters(support_data, model_source, tmp_path):
    env = {**TEST_ENV, **data_env(support_data), "TORCH_THREADS": "1", "FAISS_THREADS": "1",
           "HEALTH_INTERVAL_S": "0.5"}
    count = 10  # the eight SPEC queries, then the first two again
    rc = bench_service.main(["--compare", "cache", "--variants", "no-cache,response-cache", "--count", str(count),
                             "--concurrency", "2", "--warmup", "1", "--base-port", "0", "--out", str(tmp_path),
                             "--max-duration", "300", "--startup-timeout", "240"], env=env)
    assert rc == 0
    summary = json.loads((tmp_path / "bench_service_cache.json").read_text())
    by_name = {v["variant"]["name"]: v for v in summary["variants"]}
    assert list(by_name) == ["no-cache", "response-cache"]
    off, on = by_name["no-cache"], by_name["response-cache"]
    for v in (off, on):
        assert v["stats"]["ok"] == count and not v["stats"]["errors"] and not v["error"]
        assert len(v["nodes"]) == 3 and all(n["peak_rss_bytes"] for n in v["nodes"])
    assert all(c.get("hits", 0) == 0 for c in off["caches"].values())
    response = on["caches"]["response"]
    # The warm-up's entry was cleared: the eight distinct queries miss, and each repeat
    # hits, or joins its first asking if that is still in flight (closed loop, two clients).
    assert response["hits"] + response["misses"] == count
    assert response["hits"] + response["joined"] == count - 8
    assert off["ratio_to_baseline"] == 1.0 and on["ratio_to_baseline"] > 0
    # Each variant records every node as it ran (rag_node_info; settings, or 'unknown' before GET /settings);
    # the caches are what --compare cache measures, so they are not warned about.
    for v in (off, on):
        assert [n["info"]["role"] for n in v["provenance"]["nodes"]] == ["gateway+worker", "worker", "index"]
        assert not [w for w in v["warnings"] if "cache" in w]
    settings = on["provenance"]["nodes"][0]["settings"]
    assert settings == "unknown" or settings["RESPONSE_CACHE_SIZE"] == "1024"
    assert len(summary["tool"]["commit"]) == 40
