"""The overhead-floor tools end to end: profiling.overhead_floor against a real null-mode cluster of three
node processes on 127.0.0.1, and profiling.engine_overhead against this checkout's engine, each beside
a second commit (HEAD) in the same run."""
from __future__ import annotations

import json
import math

import pytest

from profiling import engine_overhead, overhead_floor

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def standins_env(model_source, monkeypatch):
    monkeypatch.setenv("STANDIN_HOME", str(model_source.cache_dir.parent))
    monkeypatch.setenv("STANDIN_PROFILE", "tiny")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TORCH_THREADS", "1")


def test_the_floor_tool_answers_every_request_of_a_null_cluster_and_times_each_component(tmp_path, standins_env):
    assert overhead_floor.main(["--quick", "--out", str(tmp_path), "--docs", "300"]) == 0
    report = json.loads((tmp_path / "overhead_floor.json").read_text())
    run = report["results"]["here"]
    # What node 0's /health said it ran: the null models, named as such.
    assert run["model_source"] == "null:tiny" and set(run["device"].values()) == {"cpu/null"}
    assert [level["clients"] for level in run["levels"]] == [1, 4]
    for level in run["levels"]:
        assert level["sent"] == level["ok"] == 4 and not level["errors"]
        assert level["requests_per_minute"] > 0
        latency = level["latency_ms"]
        assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"]
        parts = level["components_ms"]
        assert parts["requests (count)"] == 4 and 1 <= parts["served by node 1 (count)"] <= 3  # round robin
        for name in ("client and HTTP to node 0", "node 0: edge and routing (own worker's requests)",
                     "relay to node 1", "node 1: edge and worker outside stages", "index call: node 2 /search",
                     "index call: node 2 faiss batch", "generate: engine step (mean)",
                     "node 0: CPU ms per request", "node 1: CPU ms per request", "node 2: CPU ms per request",
                     "load generator: CPU ms per request"):
            assert math.isfinite(parts[name]) and parts[name] > 0, name
        for stage in ("embed", "search", "fetch", "rerank", "generate", "sentiment", "toxicity"):
            assert parts[f"{stage}: in stage"] > 0 and parts[f"{stage}: queue wait"] >= 0, stage
        # Every answer runs to the contract's cap: the null LM never ends a sequence.
        assert parts["generate: steps per request"] == pytest.approx(128)


def test_the_engine_tool_counts_a_steps_ops_beside_another_commit(tmp_path, standins_env):
    assert engine_overhead.main(["--quick", "--out", str(tmp_path), "--compare", "HEAD"]) == 0
    report = json.loads((tmp_path / "engine_overhead.json").read_text())
    results = report["results"]
    assert set(results) == {"here", "HEAD"}
    for result in results.values():
        for model in ("null", "qwen"):
            for rows in ("1", "4"):
                r = result[model][rows]
                assert r["ops_per_step"] > 0 and all(ms > 0 for ms in r["host_ms_per_step"])
                assert sum(n for _, n in r["top_ops"]) <= r["ops_per_step"]
        # Beyond the engine alone, each of the Qwen decoder's 2 layers dispatches at least its 4 products, 2
        # norms and its attention, and the step its last norm and output layer (more where a kernel is not built).
        assert result["qwen"]["1"]["ops_per_step"] >= result["null"]["1"]["ops_per_step"] + 2 * 7 + 2
        # Its products are recorded and replayed: q/k/v, o, gate/up and down a layer (2 layers), the output
        # layer's; the engine alone multiplies by no weight.
        for rows in ("1", "4"):
            assert result["qwen"][rows]["products_per_step"] == 4 * 2 + 1
            # Timed, so only its sign is asserted: replayed alone the products may outlast a step on a busy machine.
            assert result["qwen"][rows]["products_ms_per_step"] > 0
            assert result["null"][rows]["products_per_step"] == 0
