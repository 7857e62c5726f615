"""profiling.bench_service: the variants' settings, and one small comparison on real local clusters."""
from __future__ import annotations

import pytest

from pipeline.config import Settings
from pipeline.spec import Stage
from profiling import bench_service
from profiling.lib.prometheus import MetricsSnapshot
from tests.helpers import TEST_ENV

pytestmark = pytest.mark.timeout(600)


def _settings(variant: bench_service.Variant) -> Settings:
    return Settings.from_env({**TEST_ENV, **variant.env})


def test_unbatched_baseline_forces_every_stage_to_one_at_a_time():
    unbatched, batched = bench_service.batching_variants(cores=2)
    slow, fast = _settings(unbatched), _settings(batched)
    assert all(slow.batching(stage).max_batch == 1 for stage in Stage)
    assert slow.generate.mode == "static"
    defaults = Settings.from_env(TEST_ENV)
    assert all(fast.batching(stage) == defaults.batching(stage) for stage in Stage)
    assert fast.generate.mode == defaults.generate.mode == "continuous"


@pytest.mark.parametrize("compare", ["batching", "threads", "precision", "workers"])
def test_comparisons_other_than_cache_run_with_caches_off(compare):
    for variant in bench_service.COMPARISONS[compare](2):
        settings = _settings(variant)
        assert settings.embed.cache_size == 0 and settings.gateway.response_cache_size == 0, variant.name


def test_thread_variants_that_coincide_on_a_machine_run_once(model_source):
    def plan(cores):
        variants = bench_service.thread_variants(cores)
        envs = [bench_service.pinned_env({**TEST_ENV, **v.env}, cores) for v in variants]
        return {v.name: (env["TORCH_THREADS"], env["FAISS_THREADS"], env["WAITRESS_THREADS"], same)
                for v, env, same in bench_service.plan_runs(variants, envs)}

    two = plan(2)  # the budget splits 2 cores into one torch thread per worker: one per stage
    assert two["budget"] == ("1", "1", "0", "")
    assert two["one-per-stage"] == ("1", "1", "0", "budget")
    assert two["library-defaults"] == ("2", "2", "4", "")
    assert two["cores-per-worker"] == ("2", "1", "0", "")
    eight = plan(8)
    assert eight["budget"][:1] == ("4",) and not any(same for *_, same in eight.values())


def test_precision_variants_are_exact_against_the_fast_table_whatever_the_callers_overrides():
    from pipeline.device import placement_for
    from pipeline.precision import FAST
    exact, fast = bench_service.precision_variants(cores=2)
    assert (exact.name, fast.name) == ("exact", "fast")
    caller = {**TEST_ENV, "DTYPE": "float32", "EMBED_PRECISION": "int8-weight", "GENERATE_PRECISION": "bfloat16"}
    for variant, expected in ((exact, lambda stage: "float32"), (fast, lambda stage: FAST["cpu-bf16"][stage])):
        settings = Settings.from_env({**caller, **variant.env})
        for stage in ("embed", "rerank", "generate", "sentiment", "toxicity"):
            placement = placement_for(settings, stage, bf16_cpu=lambda: True, amx_cpu=lambda: False,
                                      cuda_available=lambda: False)
            assert placement.precision == expected(stage), (variant.name, stage)
    assert [v.name for v in bench_service.choose_variants("precision", None, 2)] == ["exact", "fast"]


def test_worker_variants_lay_out_two_three_and_four_workers_with_the_cores_split_between_them(model_source):
    variants = bench_service.worker_variants(2)
    envs = [bench_service.pinned_env({**bench_service.base_env(TEST_ENV, 9000, 60, bench_service.nodes_of(v.env)),
                                      **v.env}, 2) for v in variants]
    clusters = [Settings.from_env(env).cluster for env in envs]
    assert [c.workers for c in clusters] == [(0, 1), (0, 1, 2), (0, 1, 2, 3)]
    assert [c.index_nodes for c in clusters] == [(2,), (3,), (4,)]
    assert [str(c.node_address(c.total_nodes - 1)) for c in clusters] == ["127.0.0.1:9002", "127.0.0.1:9003",
                                                                        "127.0.0.1:9004"]
    assert [env["TORCH_THREADS"] for env in envs] == ["1", "1", "1"]


def test_unknown_variant_names_are_refused():
    assert [v.name for v in bench_service.choose_variants("cache", "response-cache,no-cache", 2)] == [
        "response-cache", "no-cache"]
    with pytest.raises(ValueError, match="no-such"):
        bench_service.choose_variants("cache", "no-cache,no-such", 2)


def test_cache_deltas_sum_over_nodes():
    def snap(hits, misses):
        return MetricsSnapshot("u", {("rag_cache_hits_total", (("cache", "embedding"),)): hits,
                                     ("rag_cache_misses_total", (("cache", "embedding"),)): misses})

    deltas = bench_service.cache_deltas([snap(1, 2), snap(0, 0), MetricsSnapshot("u", {})],
                                        [snap(4, 3), snap(2, 5), MetricsSnapshot("u", {}, error="http_404")])
    assert deltas == {"embedding": {"hits": 5.0, "misses": 6.0}}  # kinds a node does not export are left out
