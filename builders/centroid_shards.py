"""Centroid shards from a built unsharded IVF index: each shard file keeps the trained index (same
quantizer, nlist, nprobe) with only the inverted lists it owns filled, copied list by list in their
stored order; the coarse quantizer is written alone beside them for the searching nodes
(pipeline.centroid_routing).

    python -m builders.data build --out DIR --shards 4 --sharding centroid [--balance kmeans|bisect|greedy]

builds the unsharded version, then :func:`split_version` rewrites it in place: the manifest removed
first (the directory is incomplete until the new one is written), the shard files and the quantizer
written under temporary names and renamed, the unsharded file removed, the manifest written last with
``shards`` and ``sharding`` (the owner of every list). Peak memory: one shard's lists.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from builders.build_files import BuildError, output_paths
from builders.manifest import file_sha256
from pipeline.centroid_routing import CENTROID, METHODS, assign_lists, quantizer_path, sharding_record
from pipeline.data_version import Manifest, fsync_dir, read_manifest, remove_manifest, write_manifest
from pipeline.shards import shard_path


class CentroidShardError(BuildError, ValueError):
    pass


def list_sizes(index: faiss.Index) -> np.ndarray:
    ivf = faiss.extract_index_ivf(index)
    return np.array([ivf.invlists.list_size(lst) for lst in range(ivf.nlist)], dtype=np.int64)


def empty_copy(ivf: faiss.IndexIVF) -> np.ndarray:
    """`ivf` trained and empty, serialised (faiss cannot clone memory-mapped lists): its own lists are
    set aside for an empty in-memory set while it is written, then put back."""
    lists, ntotal, owned = ivf.invlists, ivf.ntotal, ivf.own_invlists
    empty = faiss.ArrayInvertedLists(ivf.nlist, ivf.code_size)
    ivf.own_invlists = False  # so that replacing them does not free them
    ivf.replace_invlists(empty, False)
    ivf.ntotal = 0
    try:
        return faiss.serialize_index(ivf)
    finally:
        ivf.replace_invlists(lists, owned)
        ivf.ntotal = ntotal


def split_index(index: faiss.Index, owners: np.ndarray, shard: int, template: np.ndarray | None = None) -> faiss.IndexIVF:
    """A copy of IVF `index` holding only the lists `owners` gives `shard`, each list's entries in order
    (`template`: :func:`empty_copy` of it, when made once for every shard)."""
    if not isinstance(index, faiss.IndexIVF):
        raise CentroidShardError(f"centroid shards need a plain IVF index, got {type(index).__name__}")
    ivf = index
    out = faiss.deserialize_index(empty_copy(ivf) if template is None else template)
    lists, code_size = ivf.invlists, ivf.code_size
    for lst in np.flatnonzero(owners == shard).tolist():
        n = lists.list_size(lst)
        if n:
            # Copies held in names: swig_ptr keeps no reference to its array.
            codes = np.array(faiss.rev_swig_ptr(lists.get_codes(lst), n * code_size), dtype=np.uint8)
            ids = np.array(faiss.rev_swig_ptr(lists.get_ids(lst), n), dtype=np.int64)
            out.invlists.add_entries(lst, n, faiss.swig_ptr(ids), faiss.swig_ptr(codes))
            out.ntotal += n
    return out


def split_version(version_dir: str | Path, shards: int, method: str = "kmeans") -> dict:
    """Rewrite the unsharded version in `version_dir` as `shards` centroid shards; the new manifest's dict."""
    version_dir = Path(version_dir)
    manifest = read_manifest(version_dir)
    if manifest.shards != 1:
        raise CentroidShardError(f"{version_dir} is already in {manifest.shards} shards: build it unsharded first")
    _, index_path = output_paths(version_dir)
    index = faiss.read_index(os.fspath(index_path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    if not isinstance(index, faiss.IndexIVF):
        raise CentroidShardError(f"{index_path} is a {type(index).__name__}: centroid shards split a plain IVF index")
    ivf = index
    if not 2 <= shards <= ivf.nlist:
        raise CentroidShardError(f"--shards must be between 2 and nlist ({ivf.nlist}) for centroid shards, got {shards}")
    owners = assign_lists(ivf.quantizer.reconstruct_n(0, ivf.nlist), list_sizes(ivf), shards, method)
    finals = [shard_path(index_path, shard, shards) for shard in range(shards)] + [quantizer_path(index_path)]
    temps = [path.with_name(f".{path.name}.partial") for path in finals]
    remove_manifest(version_dir)
    try:
        template = empty_copy(ivf)
        for shard in range(shards):
            faiss.write_index(split_index(index, owners, shard, template), os.fspath(temps[shard]))
        faiss.write_index(ivf.quantizer, os.fspath(temps[-1]))
        for temp in temps:
            _fsync(temp)
    except BaseException:
        for temp in temps:
            temp.unlink(missing_ok=True)
        raise
    del index, ivf
    for temp, final in zip(temps, finals):
        os.replace(temp, final)
    index_path.unlink()
    fsync_dir(version_dir)
    names = [path.name for path in finals]
    new = dataclasses.replace(
        manifest, shards=shards, index_files=names, index_sha256={path.name: file_sha256(path) for path in finals},
        sharding=sharding_record(owners, shards, method, finals[-1].name))
    write_manifest(version_dir, new)
    return new.to_json()


def _fsync(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def add_arguments(build: argparse.ArgumentParser) -> None:
    """`builders.data build`'s options for the layout."""
    build.add_argument("--sharding", choices=("hash", CENTROID), default="hash",
                       help="hash: shard k holds doc_id %% N == k; centroid: shard k owns a set of IVF lists, and "
                            "workers route each query to the shards owning its nprobe nearest lists")
    build.add_argument("--balance", choices=METHODS, default="kmeans",
                       help="centroid shards, balanced by list sizes: kmeans (the centroids' k-means groups), bisect "
                            "(halves along the widest direction) or greedy (largest list to the least-loaded shard)")


def with_centroid_shards(args: argparse.Namespace, build: Callable[[argparse.Namespace], Any]) -> Any:
    """`build(args)` as given (hash shards), or unsharded and then split in `args.shards` centroid shards."""
    if getattr(args, "sharding", "hash") != CENTROID:
        return build(args)
    if args.shards < 2:
        raise CentroidShardError(f"--sharding centroid needs --shards 2 or more, got {args.shards}")
    result = build(argparse.Namespace(**{**vars(args), "shards": 1}))
    manifest = Manifest.from_json(split_version(args.out, args.shards, args.balance))
    return dataclasses.replace(result, shards=args.shards, manifest=manifest)
