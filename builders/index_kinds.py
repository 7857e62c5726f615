"""The index kinds a build can write (``--index SPEC``, a FAISS index_factory string) and their parameters.

* ``IVF{n},Flat``: today's default, streamed to disk by builders.ivf_writer (any size).
* ``IVF{n},SQ8``: 8-bit scalar quantization in the lists (a quarter of Flat's bytes).
* ``IVF{n},PQ{m}`` and ``OPQ{m},IVF{n},PQ{m}``: product quantization (m bytes a vector; OPQ rotates
  first), the short list of ``REFINE_FACTOR * k`` re-ranked exactly from the stored vectors (faiss
  IndexRefineFlat), so its top 10 are ordered by true distance.
* ``HNSW{M},Flat``: a graph over the full vectors; no training, no lists.

``{n}`` may be left out (``IVF,SQ8``): the build's nlist (``--nlist`` or its default). Every kind but
IVF-Flat is built in memory, one index per shard. Kinds that add vectors with arbitrary ids through
a map (HNSW, the refined PQ kinds) are written inside an ``IndexIDMap``, so their ids are doc_ids like
IVF's.

Training, and what bounds it: the coarse quantizer is faiss's own k-means (its ``cp``: 10 iterations,
its fixed seed) on the build's sample of 39 points a list, the least faiss accepts without a warning;
PQ's codebooks train on at most 256 points a centroid (65,536), faiss's own bound. OPQ's rotation
trains on ``OPQ_TRAIN_POINTS`` (64 a codebook centroid, over faiss's 39; faiss: 65,536) with
``OPQ_NITER`` alternations instead of faiss's 50, the first one's codebooks trained
``OPQ_NITER_PQ_0`` k-means iterations instead of 40. Every alternation retrains 96 codebooks and
rotates the whole sample, so its cost is the sample's size times the alternations: at 200,000 × 768
with faiss's defaults the OPQ build took 282 s alone against plain PQ's 92, the difference the
rotation's training. Its objective (the codes' squared error) on 16,384 of the 768-d mixture vectors:
0.245 at the random start, 0.066 after 20 alternations, 0.062 after 32, still falling slowly; 10 or
40 first iterations give the same descent (0.205 against 0.206 after 2 alternations): they refine
codebooks for a random rotation that the next alternation replaces. Recall@10 of
``OPQ96,IVF1282,PQ96`` over 50,000 of those vectors (profiling.index_bench, 500 queries), these bounds
against faiss's defaults: 0.9330 against 0.9338 at nprobe 64, 0.9894 against 0.9908 at 256.

:func:`shared_training` lets a process that builds several kinds over the same vectors
(profiling.index_bench) train each coarse quantizer once: the k-means is deterministic, so the
centroids are those each build would train.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np

from builders.build_files import BuildError, fsync_path

log = logging.getLogger(__name__)

MAX_NLIST = 4096
POINTS_PER_LIST = 39  # faiss warns below 39 training points per centroid
PQ_CENTROIDS = 256  # 8-bit codes: each sub-quantizer trains 256 centroids
DEFAULT_INDEX = "IVF,Flat"
DEFAULT_EF_SEARCH = 64
REFINE_FACTOR = 4  # PQ kinds re-rank k * 4 candidates exactly
OPQ_NITER = 20  # OPQ's rotation/codebook alternations (faiss: 50); see the module's docstring
OPQ_NITER_PQ_0 = 10  # k-means iterations of the first alternation's codebooks (faiss: 40)
OPQ_TRAIN_POINTS = 64 * PQ_CENTROIDS  # the rotation's training sample (faiss: 65,536)

_FORMS = "IVF{n},Flat | IVF{n},SQ8 | IVF{n},PQ{m} | OPQ{m},IVF{n},PQ{m} | HNSW{M},Flat | auto"


class InvalidBuildArgument(BuildError, ValueError):
    pass


@dataclass(frozen=True)
class IvfParams:
    nlist: int
    nprobe: int
    train_size: int


@dataclass(frozen=True)
class IndexKind:
    family: str  # IVF-Flat, IVF-SQ8, IVF-PQ, OPQ-IVF-PQ, HNSW-Flat
    nlist: int | None = None  # None: the build's nlist
    m: int | None = None  # PQ bytes per vector, or HNSW's neighbours per node

    @property
    def is_ivf(self) -> bool:
        return self.family != "HNSW-Flat"

    @property
    def streamed(self) -> bool:
        return self.family == "IVF-Flat"

    @property
    def refined(self) -> bool:
        return self.family.endswith("PQ")

    def factory(self, nlist: int) -> str:
        """The faiss index_factory string (without the refinement and id map the build adds)."""
        return {"IVF-Flat": f"IVF{nlist},Flat", "IVF-SQ8": f"IVF{nlist},SQ8", "IVF-PQ": f"IVF{nlist},PQ{self.m}",
                "OPQ-IVF-PQ": f"OPQ{self.m},IVF{nlist},PQ{self.m}", "HNSW-Flat": f"HNSW{self.m},Flat"}[self.family]


_PATTERNS = (
    (re.compile(r"IVF(\d*),Flat"), "IVF-Flat"),
    (re.compile(r"IVF(\d*),SQ8"), "IVF-SQ8"),
    (re.compile(r"IVF(\d*),PQ(\d+)"), "IVF-PQ"),
    (re.compile(r"OPQ(\d+),IVF(\d*),PQ(\d+)"), "OPQ-IVF-PQ"),
    (re.compile(r"HNSW(\d+)(?:,Flat)?"), "HNSW-Flat"),
)


def parse_index_spec(spec: str, dim: int) -> IndexKind:
    """``--index SPEC`` as an IndexKind; InvalidBuildArgument naming the accepted forms."""
    text = spec.replace(" ", "")
    for pattern, family in _PATTERNS:
        match = pattern.fullmatch(text)
        if match is None:
            continue
        groups = match.groups()
        if family == "HNSW-Flat":
            kind = IndexKind(family, m=int(groups[0]))
        elif family == "OPQ-IVF-PQ":
            if groups[0] != groups[2]:
                raise InvalidBuildArgument(f"--index {spec}: OPQ{{m}} and PQ{{m}} must have the same m")
            kind = IndexKind(family, _nlist(groups[1]), int(groups[2]))
        else:
            kind = IndexKind(family, _nlist(groups[0]), int(groups[1]) if len(groups) > 1 else None)
        _check(kind, spec, dim)
        return kind
    raise InvalidBuildArgument(f"--index {spec!r} is not an index kind this build writes: {_FORMS}")


def _nlist(text: str) -> int | None:
    return int(text) if text else None


def _check(kind: IndexKind, spec: str, dim: int) -> None:
    if kind.nlist is not None and kind.nlist < 1:
        raise InvalidBuildArgument(f"--index {spec}: IVF needs at least 1 list")
    if kind.family == "HNSW-Flat" and not 2 <= (kind.m or 0) <= 256:
        raise InvalidBuildArgument(f"--index {spec}: HNSW{{M}} needs M from 2 to 256")
    if kind.refined and (not kind.m or dim % kind.m):
        raise InvalidBuildArgument(f"--index {spec}: PQ{{m}} needs m dividing the dimension {dim}")


def default_nlist(n_vectors: int) -> int:
    return max(1, min(MAX_NLIST, n_vectors // POINTS_PER_LIST))


def ivf_params(n_docs: int, nlist: int | None, nprobe: int, train_size: int | None, batch_size: int,
               shards: int = 1, kind: IndexKind | None = None) -> IvfParams:
    if n_docs < 1:
        raise InvalidBuildArgument(f"--docs must be >= 1, got {n_docs}")
    if not 1 <= shards <= n_docs:
        raise InvalidBuildArgument(f"--shards must be between 1 and the number of documents ({n_docs}), got {shards}")
    if batch_size < 1:
        raise InvalidBuildArgument(f"--batch-size must be >= 1, got {batch_size}")
    if nprobe < 1:
        raise InvalidBuildArgument(f"--nprobe must be >= 1, got {nprobe}")
    if kind is not None and kind.nlist is not None:
        nlist = kind.nlist
    nlist = default_nlist(n_docs) if nlist is None else nlist
    if not 1 <= nlist <= n_docs:
        # k-means needs at least one training point per list.
        raise InvalidBuildArgument(f"--nlist must be between 1 and the number of documents ({n_docs}), got {nlist}")
    if kind is not None and kind.refined and n_docs < PQ_CENTROIDS:
        raise InvalidBuildArgument(f"--index {kind.factory(nlist)}: PQ trains {PQ_CENTROIDS} centroids per "
                                   f"sub-quantizer and needs at least as many documents, got {n_docs}")
    # Shards share the one quantizer, trained as the unsharded index's: same nlist, nprobe, sample.
    if train_size is None:
        floor = PQ_CENTROIDS * POINTS_PER_LIST if kind is not None and kind.refined else 0
        train_size = min(n_docs, max(POINTS_PER_LIST * nlist, floor))
    if not nlist <= train_size <= n_docs:
        raise InvalidBuildArgument(f"train_size must be between nlist ({nlist}) and {n_docs}, got {train_size}")
    return IvfParams(nlist=nlist, nprobe=min(nprobe, nlist), train_size=train_size)


@dataclass
class SharedTraining:
    """The coarse quantizers trained while :func:`shared_training` is open, by (nlist, dim, the sample's
    digest): their centroids and the seconds their k-means took. ``reused_s``: the k-means seconds that
    builds skipped by reusing one (what each would have spent training its own)."""
    quantizers: dict[tuple[int, int, str], tuple[np.ndarray, float]] = field(default_factory=dict)
    reused_s: float = 0.0


_shared: SharedTraining | None = None


@contextmanager
def shared_training() -> Iterator[SharedTraining]:
    """Within it, builds that train the same coarse quantizer (the same nlist on the same sample: IVF-Flat,
    SQ8 and PQ over one stream of vectors) train it once; opened inside another, it is that one. A build
    alone trains its own."""
    global _shared
    if _shared is not None:
        yield _shared
        return
    _shared = SharedTraining()
    try:
        yield _shared
    finally:
        _shared = None


def train_coarse(ivf: faiss.IndexIVF, sample: np.ndarray) -> None:
    """``ivf``'s quantizer trained as faiss's IndexIVF.train trains it (k-means with the index's ``cp``),
    or given those centroids by the open :func:`shared_training`; the index's own train then skips it."""
    x = np.ascontiguousarray(sample, dtype=np.float32)
    key = (ivf.nlist, ivf.d, hashlib.blake2b(x.data, digest_size=16).hexdigest()) if _shared is not None else None
    if _shared is not None and key in _shared.quantizers:
        centroids, seconds = _shared.quantizers[key]
        ivf.quantizer.reset()
        ivf.quantizer.add(centroids)
        _shared.reused_s += seconds
        log.info("coarse quantizer (nlist %d) reused: its k-means took %.1f s", ivf.nlist, seconds)
        return
    started = time.perf_counter()
    ivf.quantizer.reset()
    faiss.Clustering(ivf.d, ivf.nlist, ivf.cp).train(x, ivf.quantizer)
    seconds = time.perf_counter() - started
    log.info("coarse quantizer k-means: %d vectors, dim %d, nlist %d in %.1f s", len(x), ivf.d, ivf.nlist, seconds)
    if _shared is not None and key is not None:
        _shared.quantizers[key] = (ivf.quantizer.reconstruct_n(0, ivf.nlist), seconds)


def train_ivfflat(sample: np.ndarray, params: IvfParams) -> faiss.IndexIVFFlat:
    dim = sample.shape[1]
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(dim), dim, params.nlist, faiss.METRIC_L2)
    train_coarse(index, sample)
    index.train(np.ascontiguousarray(sample, dtype=np.float32))  # the quantizer is trained: nothing left to train
    index.nprobe = params.nprobe  # stored in the file
    return index


def trained_index(kind: IndexKind, sample: np.ndarray, params: IvfParams,
                  ef_search: int = DEFAULT_EF_SEARCH) -> faiss.Index:
    """An empty index of ``kind``, trained on ``sample``, its nprobe / efSearch set (stored in the file)."""
    dim = sample.shape[1]
    started = time.perf_counter()
    index = faiss.index_factory(dim, kind.factory(params.nlist) + (",RFlat" if kind.refined else ""), faiss.METRIC_L2)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and isinstance(faiss.downcast_index(ivf), faiss.IndexIVFPQ):
        faiss.downcast_index(ivf).do_polysemous_training = False  # the factory's default; it costs minutes and the search never uses it
    if not index.is_trained:
        x = np.ascontiguousarray(sample, dtype=np.float32)
        opq = _opq_matrix(index)
        if opq is not None:
            opq.niter, opq.niter_pq_0, opq.max_train_points = OPQ_NITER, OPQ_NITER_PQ_0, OPQ_TRAIN_POINTS
            opq.train(x)  # the pre-transform's own train then skips it and trains the IVF on the rotated sample
            log.info("OPQ rotation: %d alternations in %.1f s", opq.niter, time.perf_counter() - started)
        if ivf is not None:
            train_coarse(ivf, x if opq is None else opq.apply(x))
        log.info("training %s: %d vectors, dim %d", kind.factory(params.nlist), len(sample), dim)
        index.train(x)
    if kind.refined:
        faiss.downcast_index(index).k_factor = REFINE_FACTOR
    if ivf is not None:
        ivf.nprobe = params.nprobe
    else:
        faiss.downcast_index(index).hnsw.efSearch = ef_search
    log.info("trained in %.1f s", time.perf_counter() - started)
    return index


def _opq_matrix(index: faiss.Index) -> faiss.OPQMatrix | None:
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexRefine):
        inner = faiss.downcast_index(inner.base_index)
    if isinstance(inner, faiss.IndexPreTransform):
        transform = faiss.downcast_VectorTransform(inner.chain.at(0))
        return transform if isinstance(transform, faiss.OPQMatrix) else None
    return None


def write_in_memory(paths: Sequence[Path], index: faiss.Index, batches: Callable[[], Iterable[np.ndarray]],
                    n: int) -> None:
    """``index`` (trained, empty) filled with the ``n`` vectors of ``batches()``, vector i (id i) into
    ``paths[i % len(paths)]``'s copy, each copy written with faiss."""
    shards = len(paths)
    copies = [_with_ids(faiss.clone_index(index)) for _ in paths]
    started, done = time.perf_counter(), 0
    for x in batches():
        ids = np.arange(done, done + len(x), dtype=np.int64)
        for shard, copy in enumerate(copies):
            mine = ids % shards == shard
            if mine.any():
                copy.add_with_ids(np.ascontiguousarray(x[mine], dtype=np.float32), ids[mine])
        done += len(x)
    if done != n:
        raise RuntimeError(f"vector source yielded {done} vectors, expected {n}")
    log.info("added %d vectors in %.1f s (drawing them included)", n, time.perf_counter() - started)
    for path, copy in zip(paths, copies):
        faiss.write_index(copy, os.fspath(path))
        fsync_path(path)


def _with_ids(index: faiss.Index) -> faiss.Index:
    """IVF kinds keep ids in their lists; the others get an IndexIDMap (HNSW and refinement number
    vectors in insertion order)."""
    # `index` is faiss.clone_index's, already of its own class; a downcast wrapper would not own it.
    if isinstance(index, (faiss.IndexIVF, faiss.IndexPreTransform)):
        return index
    return faiss.IndexIDMap(index)  # faiss's Python wrapper keeps `index` alive with it


def row_batches(array: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    for start in range(0, len(array), batch_size):
        yield array[start : start + batch_size]


def sample_rows(n: int, size: int, seed: int) -> np.ndarray:
    if size >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size, replace=False))


def kind_record(kind: IndexKind, params: IvfParams, ef_search: int = DEFAULT_EF_SEARCH) -> dict:
    """The kind's entries in the manifest's ``index``."""
    types = {"IVF-Flat": "IndexIVFFlat", "IVF-SQ8": "IndexIVFScalarQuantizer", "IVF-PQ": "IndexIVFPQ",
             "OPQ-IVF-PQ": "IndexPreTransform(OPQ, IndexIVFPQ)", "HNSW-Flat": "IndexHNSWFlat"}
    record: dict = {"spec": kind.factory(params.nlist), "kind": kind.family, "type": types[kind.family]}
    if kind.is_ivf:
        record.update(nlist=params.nlist, nprobe=params.nprobe)
    else:
        record.update(hnsw_m=kind.m, ef_search=ef_search, nlist=None, nprobe=None)
    if kind.refined:
        record.update(pq_m=kind.m, refine="exact (IndexRefineFlat)", refine_k_factor=REFINE_FACTOR)
    return record
