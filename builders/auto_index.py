"""``--index auto``: the index kind with the least memory that meets the recall floor and a latency budget.

The rule (:func:`pick`, the one source for it): among the candidates whose recall@10 meets the floor and
whose search of a batch of 32 queries takes at most the budget, the one with the least bytes. Its
figures come from one of two places:

* ``builders.data build --index auto`` (:func:`choose_index`): each candidate (builders.index_kinds) is
  built in memory on the build's training sample (the course stream's first vectors, or a seeded
  sample of the embedded documents), its nprobe / efSearch tuned to the floor (builders.recall.tune),
  and its search of a batch of 32 queries timed (median of ``LATENCY_REPEATS``) through
  :class:`pipeline.vector_index.VectorIndex`. Its bytes are the written file's, scaled from the sample
  to the whole build. The candidates share the sample's queries and exact answers, and the IVF
  candidates without OPQ one coarse quantizer (index_kinds.shared_training: the same k-means on the
  same sample); each one's ``build_s_sample`` still counts that k-means, as a build of it alone would.
  Figures on a sample understate a full index's search time and may differ in recall from it; the
  build measures the chosen kind's recall again on the full index.
* ``python -m profiling.index_bench --auto``: the figures it measured on the full index (the same
  recall queries for every kind, the p50 of its latency loop at batch 32), then a build of the pick.

The manifest records every candidate's figures and the rule, under ``index.auto``.
"""
from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from builders.build_files import BuildError
from builders.index_kinds import (
    default_nlist,
    ivf_params,
    parse_index_spec,
    shared_training,
    train_ivfflat,
    trained_index,
    write_in_memory,
)
from builders.recall import Hits, Queries, exact_top_k, open_shards, sample_queries, tune

LATENCY_BATCH = 32
LATENCY_REPEATS = 5
DEFAULT_LATENCY_BUDGET_MS = 50.0
RULE = "least {size} among candidates with recall >= floor and search_ms_batch32 <= budget"


def candidates(dim: int) -> list[str]:
    m = next(m for m in (dim // 8, dim // 4, dim // 2, dim) if m >= 1 and dim % m == 0)
    return ["IVF,Flat", "IVF,SQ8", f"IVF,PQ{m}", f"OPQ{m},IVF,PQ{m}", "HNSW32,Flat"]


def pick(rows: Sequence[dict[str, Any]], floor: float, budget_ms: float,
         size: str = "bytes_estimated") -> tuple[dict[str, Any], dict[str, Any]]:
    """The candidate the rule picks among ``rows`` (each with ``spec``, ``recall``, ``search_ms_batch32``
    and ``size``) and the manifest's ``index.auto`` record; BuildError naming every figure if none fits."""
    fit = [r for r in rows if r["recall"] >= floor and r["search_ms_batch32"] <= budget_ms]
    if not fit:
        raise BuildError(f"--index auto: no candidate meets recall@10 {floor:g} within {budget_ms:g} ms: "
                         + "; ".join(f"{r['spec']} recall {r['recall']} {r['search_ms_batch32']} ms" for r in rows))
    chosen = min(fit, key=lambda r: r[size])
    return chosen, {"candidates": list(rows), "floor": floor, "latency_budget_ms": budget_ms,
                    "rule": RULE.format(size=size), "chosen": chosen["spec"]}


def evaluate(spec: str, sample: np.ndarray, floor: float, n_total: int, queries: int = 200, seed: int = 0,
             directory: Path | None = None, reference: tuple[Queries, list[Hits]] | None = None) -> dict[str, Any]:
    """One candidate's figures on ``sample``: recall@10 tuned to ``floor``, search ms, bytes (scaled).
    ``reference``: the sample's queries and their exact answers, when the caller has them."""
    kind = parse_index_spec(spec, sample.shape[1])
    n = len(sample)
    params = ivf_params(n, kind.nlist or default_nlist(n), 64, None, n, 1, kind)
    batches = lambda: iter([sample])  # noqa: E731 - the sample is the whole (replayable) source
    if reference is None:
        picked = sample_queries(batches, n, queries, seed)
        reference = picked, exact_top_k(picked.vectors, batches)
    started = time.perf_counter()
    with shared_training() as shared, tempfile.TemporaryDirectory(dir=directory) as tmp:
        reused = shared.reused_s
        path = Path(tmp) / "candidate.bin"
        index = train_ivfflat(sample, params) if kind.streamed else trained_index(kind, sample, params)
        write_in_memory([path], index, batches, n)
        build_s = time.perf_counter() - started + shared.reused_s - reused
        served = open_shards([path])
        report = tune(served, reference[0], reference[1], floor)
        batch = reference[0].vectors[:LATENCY_BATCH]
        times = []
        for _ in range(LATENCY_REPEATS):
            t0 = time.perf_counter()
            served[0].search(batch, 10)
            times.append(time.perf_counter() - t0)
        size = path.stat().st_size
    return {"spec": kind.factory(params.nlist), "recall": round(report.overall, 4), **report.params,
            "search_ms_batch32": round(1000 * float(np.median(times)), 3), "sample_vectors": n,
            "bytes_estimated": int(size * n_total / n), "build_s_sample": round(build_s, 2)}


def choose_index(sample: np.ndarray, n_total: int, floor: float,
                 budget_ms: float = DEFAULT_LATENCY_BUDGET_MS, seed: int = 0) -> tuple[str, dict[str, Any]]:
    """The spec to build and the manifest's ``index.auto`` record; BuildError if no candidate qualifies."""
    batches = lambda: iter([sample])  # noqa: E731
    picked = sample_queries(batches, len(sample), 200, seed)
    reference = picked, exact_top_k(picked.vectors, batches)
    with shared_training():
        rows = [evaluate(spec, sample, floor, n_total, seed=seed, reference=reference)
                for spec in candidates(sample.shape[1])]
    chosen, record = pick(rows, floor, budget_ms)
    return chosen["spec"], record
