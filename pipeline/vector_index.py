"""Loading and searching the FAISS index (``faiss_index.bin``).

IVF indexes are memory-mapped by default (``IO_FLAG_MMAP | IO_FLAG_READ_ONLY``): the inverted lists stay
in the file and the OS page cache, so a 13.8 GB course index opens instantly and is shared between
processes. Index types that faiss cannot map are read into memory instead, with a log line saying so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np

log = logging.getLogger(__name__)

MMAP_FLAGS = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY


class VectorIndexError(RuntimeError):
    """The index file exists but faiss cannot read it."""


class VectorIndex:
    """A thin, validating wrapper around a faiss index."""

    def __init__(self, index: faiss.Index, *, path: str | Path | None = None, is_mmap: bool = False):
        self.index = index
        self.path = Path(path) if path is not None else None
        self.is_mmap = is_mmap
        self._ivf = faiss.try_extract_index_ivf(index)
        self._hnsw = _extract_hnsw(index)

    @classmethod
    def load(cls, path: str | Path, nprobe: int | None = 64, mmap: bool = True,
             ef_search: int | None = None) -> VectorIndex:
        """Open ``path``; ``nprobe=None`` (``ef_search=None``) keeps the value stored in the file."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"faiss index not found: {path}")
        index, is_mmap = _read_index(path, mmap)
        vi = cls(index, path=path, is_mmap=is_mmap)
        if nprobe is not None:
            vi.nprobe = nprobe
        if ef_search is not None:
            vi.ef_search = ef_search
        log.info("loaded %s from %s: ntotal=%d dim=%d nprobe=%s ef_search=%s mmap=%s",
                 type(index).__name__, path, vi.ntotal, vi.dim, vi.nprobe, vi.ef_search, is_mmap)
        return vi

    @property
    def dim(self) -> int:
        return self.index.d

    @property
    def ntotal(self) -> int:
        return self.index.ntotal

    @property
    def nlist(self) -> int | None:
        return self._ivf.nlist if self._ivf is not None else None

    @property
    def nprobe(self) -> int | None:
        """Lists probed per query; None for non-IVF indexes."""
        return self._ivf.nprobe if self._ivf is not None else None

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"nprobe must be >= 1, got {value}")
        if self._ivf is None:
            log.debug("nprobe=%d ignored: %s is not an IVF index", value, type(self.index).__name__)
            return
        # Not thread-safe against concurrent searches: set it before serving.
        self._ivf.nprobe = min(int(value), self._ivf.nlist)

    @property
    def ef_search(self) -> int | None:
        """HNSW's search breadth; None for non-HNSW indexes."""
        return self._hnsw.efSearch if self._hnsw is not None else None

    @ef_search.setter
    def ef_search(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"ef_search must be >= 1, got {value}")
        if self._hnsw is None:
            log.debug("ef_search=%d ignored: %s is not an HNSW index", value, type(self.index).__name__)
            return
        self._hnsw.efSearch = int(value)  # like nprobe: set it before serving

    def search(self, embeddings: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` neighbours of each row: ``(ids int64 (n,k), distances float32 (n,k))``, padded
        by faiss with id -1 where fewer are found."""
        x = self._validate(embeddings)
        k = _validate_k(k)
        if x.shape[0] == 0:
            return np.empty((0, k), dtype=np.int64), np.empty((0, k), dtype=np.float32)
        distances, ids = self.index.search(x, k)
        return ids, distances

    def search_batch(self, vectors: Sequence[np.ndarray], k: int) -> list[tuple[list[int], list[float]]]:
        """One ``search`` call for a list of query vectors (each (d,) or (1, d)): ``(ids, distances)``
        lists per query, in input order, -1 padding kept (the document store skips it)."""
        if len(vectors) == 0:
            return []
        rows = [np.asarray(v).reshape(1, -1) if np.ndim(v) == 1 else np.asarray(v) for v in vectors]
        if any(r.shape[0] != 1 for r in rows):
            raise ValueError("search_batch expects one vector per query")
        ids, distances = self.search(np.vstack(rows), k)
        return list(zip(ids.tolist(), distances.tolist()))

    def _validate(self, embeddings: np.ndarray) -> np.ndarray:
        if not isinstance(embeddings, np.ndarray):
            raise TypeError(f"embeddings must be a numpy array, got {type(embeddings).__name__}")
        if embeddings.ndim != 2:
            raise ValueError(f"embeddings must have shape (n, {self.dim}), got {embeddings.shape}")
        if embeddings.shape[1] != self.dim:
            raise ValueError(f"embedding dimension {embeddings.shape[1]} does not match index dimension {self.dim}")
        if not np.issubdtype(embeddings.dtype, np.floating):
            raise TypeError(f"embeddings must be floating point, got {embeddings.dtype}")
        # faiss needs C-contiguous float32; this copies only when it must.
        x = np.ascontiguousarray(embeddings, dtype=np.float32)
        if not np.isfinite(x).all():
            raise ValueError("embeddings contain NaN or infinite values")
        return x

    def __repr__(self) -> str:
        return (f"VectorIndex({type(self.index).__name__}, ntotal={self.ntotal}, dim={self.dim}, "
                f"nprobe={self.nprobe}, ef_search={self.ef_search}, mmap={self.is_mmap})")


def _extract_hnsw(index: faiss.Index):
    """The HNSW graph inside an index (an IndexIDMap around an IndexHNSW, as builders write it), or None."""
    while True:
        index = faiss.downcast_index(index)
        if isinstance(index, faiss.IndexHNSW):
            return index.hnsw
        inner = getattr(index, "index", None)
        if not isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2, faiss.IndexPreTransform)) or inner is None:
            return None
        index = inner


def _validate_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return int(k)


def _read_index(path: Path, mmap: bool) -> tuple[faiss.Index, bool]:
    if mmap:
        try:
            index = faiss.read_index(os.fspath(path), MMAP_FLAGS)
        except RuntimeError as exc:
            log.info("cannot memory-map %s (%s); reading it into memory", path, _short_error(exc))
        else:
            lists = _on_disk_lists(index)
            if lists is not None:
                # faiss's on-disk lists start `prefetch_nthread` threads (32 by default) at every search call to touch
                # the pages of the lists it is about to probe: 4.3 ms of CPU a one-vector search on a 2-vCPU EPYC,
                # where the search took 0.14 ms (docs/performance.md, section 34). A served index's pages are in the
                # page cache after its first searches; before that, the searching threads fault them in themselves.
                lists.prefetch_nthread = 0
                return index, True
            # faiss ignores the flag for types without inverted lists (e.g. IndexFlat).
            log.info("%s does not support mmap; it was read into memory", type(index).__name__)
            return index, False
    try:
        return faiss.read_index(os.fspath(path)), False
    except RuntimeError as exc:
        raise VectorIndexError(f"cannot read faiss index {path}: {_short_error(exc)}") from exc


def _on_disk_lists(index: faiss.Index) -> faiss.OnDiskInvertedLists | None:
    """The index's inverted lists where they are memory-mapped from the file (faiss's on-disk lists), else None."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None or ivf.invlists is None:
        return None
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    return lists if isinstance(lists, faiss.OnDiskInvertedLists) else None


def _short_error(exc: Exception) -> str:
    # faiss messages are multi-line ("Error in ... at file:line: message"); keep the message.
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


class ShardedVectorIndex:
    """An index split in shards (pipeline.shards), searched in one process: each shard in turn,
    then the per-shard top k merged by distance. What the reference pipeline searches when
    INDEX_SHARDS > 1; a worker asks the index nodes instead."""

    def __init__(self, shards: Sequence[VectorIndex]):
        if not shards:
            raise ValueError("a sharded index needs at least one shard")
        self.shards = list(shards)

    @staticmethod
    def load(paths: Sequence[str | Path], nprobe: int | None = 64, mmap: bool = True,
             ef_search: int | None = None) -> VectorIndex | ShardedVectorIndex:
        """One file: that VectorIndex itself; several: their ShardedVectorIndex, in shard order."""
        indexes = [VectorIndex.load(path, nprobe=nprobe, mmap=mmap, ef_search=ef_search) for path in paths]
        return indexes[0] if len(indexes) == 1 else ShardedVectorIndex(indexes)

    def search(self, embeddings: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        from pipeline.shards import merge_arrays
        return merge_arrays([shard.search(embeddings, k) for shard in self.shards], k)
