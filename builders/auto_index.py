"""``--index auto``: the index kind with the least memory that meets the recall floor and a latency budget.

Each candidate (builders.index_kinds) is built in memory on the build's training sample (the course
stream's first vectors, or a seeded sample of the embedded documents), its nprobe / efSearch tuned to
the floor (builders.recall.tune), and its search of a batch of 32 queries timed (median of
``LATENCY_REPEATS``) through :class:`pipeline.vector_index.VectorIndex`. Its bytes are the written
file's, scaled from the sample to the whole build. The manifest records every candidate's figures and
the rule, under ``index.auto``. Figures on a sample understate a full index's search time and may
differ in recall from it; the build measures the chosen kind's recall again on the full index.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from builders.build_files import BuildError
from builders.index_kinds import (
    default_nlist,
    ivf_params,
    parse_index_spec,
    train_ivfflat,
    trained_index,
    write_in_memory,
)
from builders.recall import exact_top_k, open_shards, sample_queries, tune

LATENCY_BATCH = 32
LATENCY_REPEATS = 5
DEFAULT_LATENCY_BUDGET_MS = 50.0


def candidates(dim: int) -> list[str]:
    m = next(m for m in (dim // 8, dim // 4, dim // 2, dim) if m >= 1 and dim % m == 0)
    return ["IVF,Flat", "IVF,SQ8", f"IVF,PQ{m}", f"OPQ{m},IVF,PQ{m}", "HNSW32,Flat"]


def evaluate(spec: str, sample: np.ndarray, floor: float, n_total: int, queries: int = 200, seed: int = 0,
             directory: Path | None = None) -> dict[str, Any]:
    """One candidate's figures on ``sample``: recall@10 tuned to ``floor``, search ms, bytes (scaled)."""
    kind = parse_index_spec(spec, sample.shape[1])
    n = len(sample)
    params = ivf_params(n, kind.nlist or default_nlist(n), 64, None, n, 1, kind)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = Path(tmp) / "candidate.bin"
        batches = lambda: iter([sample])  # noqa: E731 - the sample is the whole (replayable) source
        index = train_ivfflat(sample, params) if kind.streamed else trained_index(kind, sample, params)
        write_in_memory([path], index, batches, n)
        build_s = time.perf_counter() - started
        picked = sample_queries(batches, n, queries, seed)
        exact = exact_top_k(picked.vectors, batches)
        served = open_shards([path])
        report = tune(served, picked, exact, floor)
        batch = picked.vectors[:LATENCY_BATCH]
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
    rows = [evaluate(spec, sample, floor, n_total, seed=seed) for spec in candidates(sample.shape[1])]
    fit = [r for r in rows if r["recall"] >= floor and r["search_ms_batch32"] <= budget_ms]
    record = {"candidates": rows, "floor": floor, "latency_budget_ms": budget_ms,
              "rule": "least bytes_estimated among candidates with recall >= floor and search_ms_batch32 <= budget"}
    if not fit:
        raise BuildError(f"--index auto: no candidate meets recall@10 {floor:g} within {budget_ms:g} ms: "
                         + "; ".join(f"{r['spec']} recall {r['recall']} {r['search_ms_batch32']} ms" for r in rows))
    chosen = min(fit, key=lambda r: r["bytes_estimated"])
    return chosen["spec"], {**record, "chosen": chosen["spec"]}

