"""A streaming IndexIVFFlat writer: one file, or one per shard, without the vectors in memory.

An in-memory ``IndexIVFFlat`` holds every vector, so adding 4.5M vectors to one would need the
whole 13.8 GB index in RAM. Instead each file is written in two passes over a vector source
that can be replayed: pass 1 assigns every vector to its inverted list (one int64 per vector),
pass 2 regenerates the vectors and writes each one, with its id, straight to its final offset.

With N output files, vector ``i`` (id ``i``) goes to file ``pipeline.shards.document_shard(i, N)``;
every file keeps the one trained quantizer (same nlist, nprobe, centroids), so each is
byte-identical to ``faiss.write_index`` of the trained index after ``add_with_ids`` of its own
vectors (one file: after ``add`` of all of them). Peak memory is the assignment table plus
one batch.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from pathlib import Path

import faiss
import numpy as np
from tqdm import tqdm


def write_ivfflat(
    paths: Sequence[Path], index: faiss.IndexIVFFlat, batches: Callable[[], Iterable[np.ndarray]], n: int,
    progress: bool,
) -> None:
    """Write ``index`` (trained, empty) filled with the ``n`` vectors of ``batches()``, ids 0..n-1,
    split over ``paths``: vector ``i`` to ``paths[i % len(paths)]``.

    ``batches`` is called twice and must yield the same vectors both times.
    """
    shards = len(paths)
    lists = _assign_lists(index.quantizer, batches(), n, progress)
    layouts = [_FileLayout(index, lists[shard::shards]) for shard in range(shards)]
    with ExitStack() as stack:
        files = [stack.enter_context(open(path, "wb")) for path in paths]
        for f, layout in zip(files, layouts):
            f.write(layout.header)
            f.truncate(layout.end)
            f.flush()
        _scatter_vectors([f.fileno() for f in files], layouts, batches(), lists, progress)
        for f in files:
            os.fsync(f.fileno())


def _assign_lists(quantizer: faiss.Index, batches: Iterable[np.ndarray], n: int, progress: bool) -> np.ndarray:
    """Pass 1: the inverted list of every vector, exactly as ``IndexIVF.add`` computes it."""
    lists = np.empty(n, dtype=np.int64)
    done = 0
    with tqdm(total=n, desc="vectors (assign)", unit="vec", unit_scale=True, disable=not progress) as bar:
        for x in batches:
            if done + len(x) > n:
                raise RuntimeError(f"vector source yielded more than {n} vectors")
            lists[done : done + len(x)] = quantizer.assign(x, 1).ravel()
            done += len(x)
            bar.update(len(x))
    if done != n:
        raise RuntimeError(f"vector source yielded {done} vectors, expected {n}")
    return lists


def _scatter_vectors(
    fds: list[int], layouts: list[_FileLayout], batches: Iterable[np.ndarray], lists: np.ndarray, progress: bool
) -> None:
    """Pass 2: each vector and its id to its file's slot; lists keep ids in increasing order."""
    shards = len(fds)
    done = 0
    with tqdm(total=len(lists), desc="vectors (write)", unit="vec", unit_scale=True, disable=not progress) as bar:
        for x in batches:
            batch_lists = lists[done : done + len(x)]
            for shard, (fd, layout) in enumerate(zip(fds, layouts)):
                first = (shard - done) % shards  # the batch's first row whose id falls in this shard
                rows = slice(first, None, shards)
                ids = done + first + shards * np.arange(len(batch_lists[rows]), dtype=np.int64)
                layout.write(fd, x[rows], ids, batch_lists[rows])
            done += len(x)
            bar.update(len(x))
    if done != len(lists) or not all(layout.complete for layout in layouts):
        raise RuntimeError("vector source changed between the two passes")


class _FileLayout:
    """Where each inverted list of one file lies, and how far each is filled.

    On disk each non-empty list is its codes (size * code_size bytes) followed by its ids
    (size int64s).
    """

    def __init__(self, index: faiss.IndexIVFFlat, lists: np.ndarray):
        self.code_size = index.code_size
        self.sizes = np.bincount(lists, minlength=index.nlist).astype(np.int64)
        self.header = _ivfflat_header(index, len(lists), self.sizes)
        extents = self.sizes * (self.code_size + 8)
        self.starts = len(self.header) + np.concatenate(([0], np.cumsum(extents)[:-1]))
        self.end = len(self.header) + int(extents.sum())
        self.filled = np.zeros_like(self.sizes)

    @property
    def complete(self) -> bool:
        return bool(np.array_equal(self.filled, self.sizes))

    def write(self, fd: int, x: np.ndarray, ids: np.ndarray, batch_lists: np.ndarray) -> None:
        """Append these vectors to their lists: within a batch one list's vectors are consecutive
        in it, so each list gets one write of codes and one of ids."""
        order = np.argsort(batch_lists, kind="stable")
        codes = np.ascontiguousarray(x[order], dtype=np.float32)
        ids = np.ascontiguousarray(ids[order], dtype=np.int64)
        uniq, first, counts = np.unique(batch_lists[order], return_index=True, return_counts=True)
        for lst, i0, count in zip(uniq.tolist(), first.tolist(), counts.tolist()):
            slot, start = int(self.filled[lst]), int(self.starts[lst])
            _pwrite_all(fd, codes[i0 : i0 + count], start + slot * self.code_size)
            _pwrite_all(fd, ids[i0 : i0 + count], start + int(self.sizes[lst]) * self.code_size + slot * 8)
            self.filled[lst] += count


def _ivfflat_header(index: faiss.IndexIVFFlat, ntotal: int, sizes: np.ndarray) -> bytes:
    """Everything up to the first list's codes, as ``faiss.write_index`` lays it out.

    faiss serialises the empty index (header, quantizer, direct map) for us;
    only ntotal and the "ilar" inverted-lists header are patched in.
    """
    blob = faiss.serialize_index(index).tobytes()
    # An empty ArrayInvertedLists ends the file: "ilar", nlist, code_size, "sprs", 0 entries.
    empty_tail = b"ilar" + struct.pack("=QQ", index.nlist, index.code_size) + b"sprs" + struct.pack("=Q", 0)
    if blob[:4] != b"IwFl" or not blob.endswith(empty_tail) or struct.unpack_from("=q", blob, 8)[0] != 0:
        raise RuntimeError("unexpected faiss serialisation layout for an empty IndexIVFFlat")
    prefix = blob[:8] + struct.pack("=q", ntotal) + blob[16 : -len(empty_tail)]
    nonempty = np.flatnonzero(sizes)
    # Same rule as faiss: a dense size table when more than half the lists are used.
    if len(nonempty) > index.nlist // 2:
        kind, table = b"full", sizes
    else:
        kind, table = b"sprs", np.column_stack([nonempty, sizes[nonempty]]).ravel()
    table = np.ascontiguousarray(table, dtype=np.uint64)
    invlists = b"ilar" + struct.pack("=QQ", index.nlist, index.code_size) + kind + struct.pack("=Q", len(table))
    return prefix + invlists + table.tobytes()


def _pwrite_all(fd: int, array: np.ndarray, offset: int) -> None:
    view = memoryview(array).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
