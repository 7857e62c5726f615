"""Recall@10 of a built index against an exact search of the same vectors, per shard and overall.

Queries are a seeded sample of the documents' own vectors, each perturbed with Gaussian noise of
``noise`` times the vectors' per-dimension spread (so a query is near, not on, its document), plus any
real query vectors a caller has (``extra``). The exact top 10 is an exhaustive L2 search over the
vectors the build wrote, streamed in batches (never all in memory); the served top 10 is the search
the index node runs: the written files, opened as :class:`pipeline.vector_index.VectorIndex` with the
serving nprobe / efSearch, and for several shards their results merged (pipeline.shards).

recall@10 of one query = |served top 10 ∩ exact top 10| / |exact top 10|; a figure is the mean over
the queries. A build under its floor fails with :class:`LowRecall` unless told to accept it. A build
keeps the queries and their exact top 10 in its version (builders.recall_queries), so that
``python -m builders.recall tune DIR`` re-tunes it later, of any kind, without its vectors.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from builders.build_files import QUERIES_FILENAME, BuildError
from builders.recall_queries import Hits, Queries, kept_queries, save_queries, shard_files
from pipeline.data_version import Manifest, load_version, write_manifest
from pipeline.shards import merge_arrays
from pipeline.vector_index import VectorIndex

K = 10
DEFAULT_QUERIES = 1000
DEFAULT_NOISE = 0.1
DEFAULT_MIN_RECALL = 0.95
Batches = Callable[[], Iterable[np.ndarray]]  # replayable: vectors 0..n-1 (ids = row numbers) in order


class LowRecall(BuildError):
    """A build whose measured recall@10 is under the floor."""


@dataclass(frozen=True)
class Recall:
    """What a manifest records under ``index.recall``."""
    overall: float
    shards: list[float]
    queries: int
    noise: float
    seed: int
    params: dict[str, int]  # the serving parameters measured (nprobe, ef_search)
    k: int = K
    extra_queries: int = 0
    floor: float | None = None
    accepted_below_floor: bool = False
    tuned: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"at": self.k, "overall": round(self.overall, 4), "shards": [round(r, 4) for r in self.shards],
                "queries": self.queries, "extra_queries": self.extra_queries, "noise": self.noise, "seed": self.seed,
                "params": dict(self.params), "floor": self.floor, "accepted_below_floor": self.accepted_below_floor,
                "reference": "exact L2 search of the stored vectors", **({"tuned": self.tuned} if self.tuned else {})}


def sample_queries(batches: Batches, n: int, count: int = DEFAULT_QUERIES, seed: int = 0,
                   noise: float = DEFAULT_NOISE, extra: np.ndarray | None = None) -> Queries:
    """``count`` documents' vectors (seeded choice) plus noise, then ``extra`` (real queries' vectors)."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(n, min(count, n), replace=False))
    picked, done = [], 0
    for x in batches():
        wanted = rows[(rows >= done) & (rows < done + len(x))]
        picked.append(np.asarray(x[wanted - done], dtype=np.float32))
        done += len(x)
        if done > rows[-1]:
            break
    sample = np.concatenate(picked)
    spread = float(np.sqrt(sample.var(axis=0).mean())) if len(sample) > 1 else 1.0
    vectors = sample + rng.normal(0.0, noise * spread, sample.shape).astype(np.float32)
    if extra is not None and len(extra):
        vectors = np.vstack([vectors, np.asarray(extra, dtype=np.float32)])
    return Queries(np.ascontiguousarray(vectors), rows, noise, seed, 0 if extra is None else len(extra))


def exact_top_k(queries: np.ndarray, batches: Batches, shards: int = 1, k: int = K,
                ids_of: Callable[[int, int], np.ndarray] | None = None) -> list[Hits]:
    """Per shard, the exact top k of each query among that shard's vectors (doc_id % shards), streamed.

    ``ids_of(start, count)``: the ids of a batch's rows (default: their row numbers)."""
    heaps = [faiss.ResultHeap(len(queries), k) for _ in range(shards)]
    done = 0
    for x in batches():
        ids = np.arange(done, done + len(x), dtype=np.int64) if ids_of is None else ids_of(done, len(x))
        for shard, heap in enumerate(heaps):
            mine = ids % shards == shard
            if mine.any():
                _add_exact(heap, queries, np.ascontiguousarray(x[mine], dtype=np.float32), ids[mine], k)
        done += len(x)
    results = []
    for heap in heaps:
        heap.finalize()
        results.append((heap.I.copy(), heap.D.copy()))
    return results


def _add_exact(heap: faiss.ResultHeap, queries: np.ndarray, x: np.ndarray, ids: np.ndarray, k: int) -> None:
    flat = faiss.IndexFlatL2(x.shape[1])
    flat.add(x)
    distances, rows = flat.search(queries, k)
    labels = np.where(rows >= 0, ids[np.maximum(rows, 0)], -1)
    heap.add_result(distances, labels)


def recall_at(served: np.ndarray, exact: np.ndarray) -> float:
    """Mean over queries of |served ∩ exact| / |exact| (ids; -1 padding ignored)."""
    scores = []
    for got, want in zip(served, exact):
        truth = set(want[want >= 0].tolist())
        if truth:
            scores.append(len(truth & set(got.tolist())) / len(truth))
    return float(np.mean(scores)) if scores else 1.0


def served_recall(indexes: Sequence[VectorIndex], queries: Queries, exact: Sequence[Hits], k: int = K) -> Recall:
    """The indexes' recall as they are configured now (their nprobe / efSearch). ``exact``: one answer per
    index, or one for them all (centroid shards, measured as the unsharded index they were split from:
    their merged search is its search), whose figure is then the only shard's."""
    served = [index.search(queries.vectors, k) for index in indexes]
    overall = recall_at(merge_arrays(served, k)[0], merge_arrays(list(exact), k)[0])
    per_shard = [recall_at(got[0], want[0]) for got, want in zip(served, exact)] if len(exact) == len(served) \
        else [overall]
    return Recall(overall, per_shard, len(queries.vectors), queries.noise, queries.seed, serving_params(indexes[0]),
                  k=k, extra_queries=queries.extra)


def serving_params(index: VectorIndex) -> dict[str, int]:
    params = {"nprobe": index.nprobe, "ef_search": index.ef_search}
    return {name: int(value) for name, value in params.items() if value is not None}


def open_shards(paths: Sequence[Path], nprobe: int | None = None, ef_search: int | None = None) -> list[VectorIndex]:
    """The written files as the index node opens them (None: the value stored in the file)."""
    indexes = [VectorIndex.load(path, nprobe=nprobe, mmap=True) for path in paths]
    if ef_search is not None:
        for index in indexes:
            index.ef_search = ef_search
    return indexes


def tune(indexes: Sequence[VectorIndex], queries: Queries, exact: Sequence[Hits], floor: float) -> Recall:
    """The least nprobe (IVF) or efSearch (HNSW) on a doubling ladder whose overall recall meets
    ``floor`` (else the largest tried), left set on ``indexes``; the ladder's figures in ``tuned``."""
    first = indexes[0]
    name, top = ("nprobe", first.nlist) if first.nlist is not None else ("ef_search", 4096)
    if first.nlist is None and first.ef_search is None:
        return served_recall(indexes, queries, exact)  # nothing to tune (an exhaustive index)
    ladder = sorted({min(top or 1, 2 ** i) for i in range(0, 17) if 2 ** i >= (K if name == "ef_search" else 1)})
    tried: list[dict[str, Any]] = []
    report = None
    for value in ladder:
        for index in indexes:
            setattr(index, name, value)
        report = served_recall(indexes, queries, exact)
        tried.append({name: value, "recall": round(report.overall, 4)})
        if report.overall >= floor:
            break
    assert report is not None
    return replace(report, tuned=tried)


def check_floor(report: Recall, floor: float, accept_low: bool) -> Recall:
    """``report`` with its floor noted; LowRecall naming the figure and the floor if under it and not accepted."""
    below = report.overall < floor
    if below and not accept_low:
        worst = min(range(len(report.shards)), key=lambda s: report.shards[s])
        shard_note = f" (lowest shard {worst}: {report.shards[worst]:.4f})" if len(report.shards) > 1 else ""
        raise LowRecall(
            f"recall@{report.k} {report.overall:.4f}{shard_note} is under the floor {floor:g} (INDEX_MIN_RECALL "
            f"or --min-recall) at {_describe(report.params)} on {report.queries} queries: build with --tune (a "
            "larger nprobe / efSearch, chosen by measurement), another --index, or --accept-low-recall")
    return replace(report, floor=floor, accepted_below_floor=below)


def _describe(params: dict[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in params.items()) or "an exhaustive search"


@dataclass(frozen=True)
class RecallOptions:
    """What a build measures and what it accepts."""
    min_recall: float = DEFAULT_MIN_RECALL
    accept_low: bool = False
    tune: bool = False
    queries: int = DEFAULT_QUERIES
    noise: float = DEFAULT_NOISE
    extra: np.ndarray | None = None  # real queries' vectors, where the corpus has them
    latency_budget_ms: float = 50.0  # --index auto's (builders.auto_index): a batch of 32 searched within it
    # The queries and their exact answers when the caller has them for these very vectors (the same seed,
    # count and noise): profiling.index_bench builds several kinds over one stream and computes them once.
    reference: tuple[Queries, list[Hits]] | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_recall <= 1.0:
            raise BuildError(f"--min-recall must be between 0 and 1, got {self.min_recall}")
        if self.queries < 1:
            raise BuildError(f"--recall-queries must be >= 1, got {self.queries}")


def measure_build(paths: Sequence[Path], batches: Batches, n: int, options: RecallOptions, seed: int = 0,
                  ids_of: Callable[[int, int], np.ndarray] | None = None, nprobe: int | None = None,
                  ef_search: int | None = None, keep: Path | None = None) -> Recall:
    """The recall of the files a build wrote (one per shard, doc_id % len(paths)), tuned if asked, checked
    against the floor; served at ``nprobe`` / ``ef_search`` (None: the files' stored values). ``keep``: where
    the queries and their exact answers are written (builders.build_files.staged_queries)."""
    if n == 0:  # an update that deleted everything: nothing to miss
        return replace(Recall(1.0, [1.0] * len(paths), 0, options.noise, seed, {}), floor=options.min_recall)
    if options.reference is not None:
        queries, exact = options.reference
    else:
        queries = sample_queries(batches, n, options.queries, seed, options.noise, options.extra)
        exact = exact_top_k(queries.vectors, batches, len(paths), K, ids_of)
    if keep is not None:
        save_queries(keep, queries, exact)
    indexes = open_shards(paths, nprobe, ef_search)
    report = tune(indexes, queries, exact, options.min_recall) if options.tune else \
        served_recall(indexes, queries, exact)
    return check_floor(report, options.min_recall, options.accept_low)


def add_recall_arguments(parser: argparse.ArgumentParser, with_tune: bool = True) -> None:
    parser.add_argument("--min-recall", type=float, help="recall@10 floor (default: INDEX_MIN_RECALL)")
    parser.add_argument("--accept-low-recall", action="store_true", help="write the version even under the floor")
    parser.add_argument("--recall-queries", type=int, default=1000, help="queries the recall is measured on")
    parser.add_argument("--latency-budget-ms", type=float, default=50.0,
                        help="--index auto: the most ms a batch of 32 queries may take to search")
    if with_tune:
        parser.add_argument("--tune", action="store_true",
                            help="raise nprobe / efSearch until recall@10 meets the floor; the manifest records it")


def recall_floor(given: float | None) -> float:
    """The recall floor a command holds a build to: `given` (its --min-recall), else INDEX_MIN_RECALL."""
    if given is not None:
        return given
    from pipeline.config import Settings
    return Settings.from_env().index.min_recall


def recall_options(args: argparse.Namespace) -> RecallOptions:
    """The recall rules of a build's command line (the floor: :func:`recall_floor`)."""
    return RecallOptions(min_recall=recall_floor(args.min_recall), accept_low=args.accept_low_recall,
                         tune=getattr(args, "tune", False),
                         queries=args.recall_queries, latency_budget_ms=args.latency_budget_ms)


def stored_batches(paths: Sequence[Path]) -> tuple[Batches, np.ndarray]:
    """The vectors an IVF-Flat version's files hold, list by list (memory-mapped, replayable), and their ids
    in that order: what an update (builders.incremental), and the tuning of a version that kept no recall
    queries (builders.recall_queries), measure recall against."""
    indexes = [VectorIndex.load(path, nprobe=None, mmap=True) for path in paths]
    lists = []
    for vi in indexes:
        ivf = faiss.extract_index_ivf(vi.index)
        if not isinstance(faiss.downcast_index(ivf), faiss.IndexIVFFlat):
            raise BuildError(f"{vi.path}: only an IVF-Flat version's vectors can be read back from its index")
        lists += [(ivf.invlists, number, ivf.d) for number in range(ivf.nlist) if ivf.invlists.list_size(number)]

    def read(invlists, number: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
        size = invlists.list_size(number)
        codes = faiss.rev_swig_ptr(invlists.get_codes(number), size * dim * 4)
        ids = faiss.rev_swig_ptr(invlists.get_ids(number), size)  # counted in int64s, the codes in bytes
        return np.array(ids, dtype=np.int64), np.frombuffer(codes, dtype=np.float32).reshape(size, dim)

    ids = np.concatenate([read(*entry)[0] for entry in lists]) if lists else np.empty(0, dtype=np.int64)

    def batches() -> Iterable[np.ndarray]:
        _keep = indexes  # the mapped files stay open while the batches are read
        for entry in lists:
            yield read(*entry)[1].copy()
        del _keep
    return batches, ids


def tune_version(version_dir: Path, options: RecallOptions) -> Recall:
    """Tune a built version's nprobe (IVF) / efSearch (HNSW) to the floor, without a rebuild, against the
    recall queries its build kept (builders.recall_queries; any kind, no vectors needed), and record it
    (and the recall measured at it) in its manifest: what its nodes then serve. A version that kept none
    is measured on --recall-queries new queries from the vectors its IVF-Flat lists hold."""
    version_dir = Path(version_dir)
    manifest = load_version(version_dir)
    paths = shard_files(version_dir, manifest)
    kept = kept_queries(version_dir, manifest)
    queries, exact = kept if kept is not None else _from_stored_vectors(version_dir, manifest, paths, options)
    indexes = open_shards(paths)
    if len(exact) not in (1, len(paths)) or queries.vectors.shape[1] != indexes[0].dim:
        raise BuildError(f"{version_dir}: its recall queries ({len(exact)} shards' answers, "
                         f"{queries.vectors.shape[1]}-d) do not match its index ({len(paths)} shards, {indexes[0].dim}-d)")
    report = check_floor(tune(indexes, queries, exact, options.min_recall), options.min_recall, options.accept_low)
    write_manifest(version_dir, replace(manifest, index={**manifest.index, **report.params, "recall": report.to_json()}))
    return report


def _from_stored_vectors(version_dir: Path, manifest: Manifest, paths: list[Path],
                         options: RecallOptions) -> tuple[Queries, list[Hits]]:
    kind = manifest.index.get("kind", "IVF-Flat")
    if kind != "IVF-Flat":
        raise BuildError(f"{version_dir}: its manifest names no recall queries ({QUERIES_FILENAME}: a build before "
                         f"they were kept) and its {manifest.index.get('spec', kind)} index cannot give its vectors "
                         "back (only IVF-Flat's lists hold them whole): rebuild it with --tune")
    stored, ids = stored_batches(paths)
    queries = sample_queries(stored, len(ids), options.queries, 0, options.noise, options.extra)
    shards = 1 if manifest.sharding else len(paths)  # centroid shards: one answer over all (served_recall)
    return queries, exact_top_k(queries.vectors, stored, shards, K, lambda start, count: ids[start : start + count])


def main(argv: list[str] | None = None) -> int:
    """``python -m builders.recall tune DIR [--min-recall F] [--accept-low-recall]``."""
    import sys
    parser = argparse.ArgumentParser(prog="python -m builders.recall", description=tune_version.__doc__)
    parser.add_argument("command", choices=["tune"])
    parser.add_argument("version", type=Path, help="a complete data version's directory")
    add_recall_arguments(parser, with_tune=False)
    args = parser.parse_args(argv)
    try:
        report = tune_version(args.version, recall_options(args))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.version}: recall@10 {report.overall:.4f} at {_describe(report.params)} (shards "
          f"{', '.join(f'{r:.4f}' for r in report.shards)}), recorded in its manifest")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
