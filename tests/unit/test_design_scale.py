"""profiling.design_scale's plan, without processes: the recall the later kinds are tuned to, their nprobe ladder
and why it starts where it does, the time estimates; and its plot."""
from __future__ import annotations

import faiss
import numpy as np
import pytest

from builders.index_kinds import IvfParams, parse_index_spec, train_ivfflat, trained_index
from builders.mixture_vectors import course_vector_batches
from builders.recall import exact_top_k, recall_at
from profiling.design_scale import Target, build_estimate_s, exact_estimate_s, ladder, tuning_target
from profiling.lib.plots import design_scale_plot


def test_the_floor_met_by_the_sweep_is_the_target_from_the_least_nprobe_meeting_it():
    swept = [{"nprobe": 64, "recall": 0.91}, {"nprobe": 128, "recall": 0.951}, {"nprobe": 256, "recall": 0.97}]
    assert tuning_target(swept, 0.95, 0.01) == Target(0.95, 128, 128)


def test_a_floor_not_met_leaves_the_best_swept_recall_less_the_tolerance_from_the_least_nprobe_meeting_it():
    swept = [{"nprobe": 64, "recall": 0.91}, {"nprobe": 128, "recall": 0.935}, {"nprobe": 256, "recall": 0.94}]
    target = tuning_target(swept, 0.95, 0.01)
    assert (target.recall, target.start, target.reached_at) == (pytest.approx(0.93), 128, None)
    assert tuning_target(swept[:2], 0.95, 0.01).start == 128  # the best itself when nothing below it is near


def test_the_ladder_doubles_from_its_start_to_nlist():
    assert ladder(128, 4096) == [128, 256, 512, 1024, 2048, 4096]
    assert ladder(100, 512) == [100, 200, 400, 512]
    assert ladder(512, 512) == [512]


def test_the_estimates_grow_with_what_each_step_computes():
    build = build_estimate_s(4_600_000, 768, 4096, 100, 2)
    # the list assignment (count x nlist x dim) and four draws of the vectors dominate; 100 queries add little
    assert build_estimate_s(4_600_000, 768, 4096, 1000, 2) - build == pytest.approx(4.6e6 * 900 * 768 / 50e9)
    assert build_estimate_s(4_600_000, 768, 4096, 100, 4) == pytest.approx(build / 2)
    assert exact_estimate_s(4_600_000, 768, 1000, 2) == pytest.approx((2 * 4.6e6 * 768 * 768 + 4.6e9 * 768) / 50e9)


def test_the_plot_is_written_with_every_kind(tmp_path):
    def row(spec, nprobe, recall, ms, disk):
        return {"spec": spec, "nprobe": nprobe, "recall": recall, "disk_bytes": disk,
                "latency": {f"b{b}": {"p50_ms": ms * b, "p99_ms": 2 * ms * b} for b in (1, 8, 32)},
                "memory_serving": {"rss": disk + 10**8, "anon": 10**8}}
    rows = [row("IVF4096,Flat", 64, 0.91, 29, 14e9), row("IVF4096,Flat", 128, 0.95, 55, 14e9),
            row("IVF4096,SQ8", 128, 0.95, 30, 3.6e9)]
    path = design_scale_plot(tmp_path / "plots" / "design_scale.png", rows, 0.95)
    assert path == tmp_path / "plots" / "design_scale.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_a_course_builds_kinds_train_the_same_lists_so_codes_only_lose_neighbours():
    # why the ladder starts where the full vectors met the target: IVF-SQ8 probes the same lists as IVF-Flat
    x = next(course_vector_batches(6000, 32, 0, 6000, "mixture"))
    params = IvfParams(nlist=64, nprobe=4, train_size=39 * 64)
    flat, sq8 = train_ivfflat(x[: params.train_size], params), trained_index(
        parse_index_spec("IVF,SQ8", 32), x[: params.train_size], params)
    assert np.array_equal(flat.quantizer.reconstruct_n(0, 64), faiss.extract_index_ivf(sq8).quantizer.reconstruct_n(0, 64))
    flat.add(x)
    sq8.add(x)
    queries = x[:300] + np.float32(0.01)
    exact = exact_top_k(queries, lambda: iter([x]))[0][0]
    for nprobe in (1, 4, 16):
        flat.nprobe = faiss.extract_index_ivf(sq8).nprobe = nprobe
        per_query = [(recall_at(f[None], e[None]), recall_at(s[None], e[None]))
                     for f, s, e in zip(flat.search(queries, 10)[1], sq8.search(queries, 10)[1], exact)]
        assert all(s <= f for f, s in per_query)
