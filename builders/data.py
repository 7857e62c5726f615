"""Build the document database and FAISS index that the service reads, as a data version.

    python -m builders.data build --out DIR --kind {course,support} [--docs N]
        [--nlist N] [--nprobe 64] [--seed 0] [--shards 1] [--force] [--batch-size B]
    python -m builders.data update --from DIR_N --out DIR_N+1 --changes FILE.jsonl   (builders.incremental)

Every build is a data version (pipeline.data_version): ``DIR/manifest.json``, written last, names it
(the directory's name), its content hash, documents, embedder, index parameters and shard layout.

writes ``DIR/documents/documents.db`` and an ``IndexIVFFlat`` (L2, 768-d) whose ids are the doc_ids:
``DIR/faiss_index.bin``, or with ``--shards N`` the N files ``pipeline.shards.shard_path`` names, shard
k holding the doc_ids with ``doc_id % N == k``. Shards share the quantizer the unsharded build would
train, so a merged search over them equals the unsharded one (:mod:`pipeline.shards`).

* ``course``: the course rows (``Document {i}``) over seeded uniform-random vectors.
* ``support``: the articles of :mod:`builders.corpus`, their ``content`` embedded with the configured
  embedder.

nlist defaults to ``clamp(N // 39, 1, 4096)`` (faiss wants ~39 training points per list); the stored
nprobe is ``min(nprobe, nlist)``. The index files are streamed by :mod:`builders.ivf_writer` (peak
memory: the training sample plus one batch), byte-identical to ``faiss.write_index`` of the same
vectors in memory, and :mod:`builders.build_files` renames every file into place only after a
complete build.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import faiss
import numpy as np

from builders import centroid_shards
from builders.build_files import (
    BuildError,
    check_outputs,
    chunks,
    db_writer,
    index_files,
    output_paths,
    staged_outputs,
)
from builders.corpus import course_document, support_documents
from builders.embedding import write_and_embed
from builders.incremental import run_update
from builders.ivf_writer import write_ivfflat
from builders.manifest import (
    configured_embedder,
    configured_embedder_fn,
    index_parameters,
    random_vectors,
    version_of,
    write_build_manifest,
)
from pipeline.data_version import EmbedderInfo, Manifest
from pipeline.spec import EMBED_DIM

log = logging.getLogger(__name__)

EmbedFn = Callable[[list[str]], np.ndarray]

COURSE_DOCS = 4_500_000
SUPPORT_DOCS = 5_000
MAX_NLIST = 4096
POINTS_PER_LIST = 39  # faiss warns below 39 training points per centroid
DEFAULT_NPROBE = 64
COURSE_BATCH = 65_536
SUPPORT_BATCH = 256


class InvalidBuildArgument(BuildError, ValueError):
    pass


@dataclass(frozen=True)
class BuildResult:
    kind: str
    db_path: Path
    index_path: Path
    n_docs: int
    ntotal: int
    dim: int
    nlist: int
    nprobe: int
    train_size: int
    seed: int
    seconds: float
    shards: int = 1
    manifest: Manifest | None = None  # written last: the build is the data version it names

    @property
    def version(self) -> str | None:
        return self.manifest.version if self.manifest is not None else None

    @property
    def index_files(self) -> list[Path]:
        """The index files written: ``index_path`` itself, or one per shard."""
        return index_files(self.index_path, self.shards)

    @property
    def db_bytes(self) -> int:
        return self.db_path.stat().st_size

    @property
    def index_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.index_files)


@dataclass(frozen=True)
class _IvfParams:
    nlist: int
    nprobe: int
    train_size: int


def default_nlist(n_vectors: int) -> int:
    return max(1, min(MAX_NLIST, n_vectors // POINTS_PER_LIST))


def course_vector_batches(
    n: int, dim: int = EMBED_DIM, seed: int = 0, batch_size: int = COURSE_BATCH
) -> Iterator[np.ndarray]:
    """Vectors 0..n-1 of the course index: uniform [0, 1) float32 from one seeded stream.

    Consecutive draws continue the same stream, so the values do not depend on
    ``batch_size``.
    """
    rng = np.random.default_rng(seed)
    for start in range(0, n, batch_size):
        yield rng.random((min(batch_size, n - start), dim), dtype=np.float32)


def build_course(
    out_dir: str | Path,
    n_docs: int,
    *,
    nlist: int | None = None,
    nprobe: int = DEFAULT_NPROBE,
    seed: int = 0,
    force: bool = False,
    batch_size: int = COURSE_BATCH,
    progress: bool = True,
    dim: int = EMBED_DIM,
    train_size: int | None = None,
    shards: int = 1,
) -> BuildResult:
    """Course rows and an IVFFlat of seeded random vectors (or ``shards`` of them), streamed in batches."""
    params = _ivf_params(n_docs, nlist, nprobe, train_size, batch_size, shards)
    version_of(out_dir, None)
    started = time.perf_counter()
    with staged_outputs(out_dir, force, shards) as (db_tmp, index_tmps):
        rows = (course_document(i).as_row() for i in range(n_docs))
        with db_writer(db_tmp) as insert:
            for chunk in chunks(rows, batch_size, n_docs, "documents", progress):
                insert(chunk)
        # The stream is i.i.d., so its first vectors are a fair training sample.
        sample = next(course_vector_batches(params.train_size, dim, seed, params.train_size))
        index = _train_index(sample, params)
        del sample
        vectors = partial(course_vector_batches, n_docs, dim, seed, batch_size)
        write_ivfflat(index_tmps, index, vectors, n_docs, progress)
    manifest = write_build_manifest(out_dir, kind="course", embedder=random_vectors(dim), documents=n_docs,
                                    index=index_parameters(params, seed, dim), shards=shards)
    return _result("course", out_dir, n_docs, dim, params, seed, started, shards, manifest)


def build_support(
    out_dir: str | Path,
    n_docs: int,
    embed_fn: EmbedFn,
    *,
    nlist: int | None = None,
    nprobe: int = DEFAULT_NPROBE,
    seed: int = 0,
    force: bool = False,
    batch_size: int = SUPPORT_BATCH,
    progress: bool = True,
    train_size: int | None = None,
    shards: int = 1,
    embedder: EmbedderInfo | None = None,
) -> BuildResult:
    """Support articles and an IVFFlat (or ``shards`` of them) of their ``content`` embeddings.

    ``embed_fn(texts) -> (len(texts), d) float32`` is called once per batch of
    ``batch_size`` documents; the embeddings are kept in memory (3 KB per
    document at d=768), since recomputing them for the second pass would cost
    far more. ``embedder`` names what ``embed_fn`` computes, for the manifest (default: the embedder
    the environment configures, which the CLI embeds with).
    """
    params = _ivf_params(n_docs, nlist, nprobe, train_size, batch_size, shards)
    version_of(out_dir, None)
    started = time.perf_counter()
    with staged_outputs(out_dir, force, shards) as (db_tmp, index_tmps):
        vectors = write_and_embed(db_tmp, support_documents(n_docs, seed), n_docs, embed_fn, batch_size, progress)
        index = _train_index(vectors[_sample_rows(n_docs, params.train_size, seed)], params)
        write_ivfflat(index_tmps, index, partial(_row_batches, vectors, batch_size), n_docs, progress)
    dim = vectors.shape[1]
    identity = dataclasses.replace(embedder or configured_embedder(dim), dim=dim)
    manifest = write_build_manifest(out_dir, kind="support", embedder=identity, documents=n_docs,
                                    index=index_parameters(params, seed, dim), shards=shards)
    return _result("support", out_dir, n_docs, dim, params, seed, started, shards, manifest)


def _ivf_params(
    n_docs: int, nlist: int | None, nprobe: int, train_size: int | None, batch_size: int, shards: int = 1
) -> _IvfParams:
    if n_docs < 1:
        raise InvalidBuildArgument(f"--docs must be >= 1, got {n_docs}")
    if not 1 <= shards <= n_docs:
        raise InvalidBuildArgument(f"--shards must be between 1 and the number of documents ({n_docs}), got {shards}")
    if batch_size < 1:
        raise InvalidBuildArgument(f"--batch-size must be >= 1, got {batch_size}")
    if nprobe < 1:
        raise InvalidBuildArgument(f"--nprobe must be >= 1, got {nprobe}")
    nlist = default_nlist(n_docs) if nlist is None else nlist
    if not 1 <= nlist <= n_docs:
        # k-means needs at least one training point per list.
        raise InvalidBuildArgument(f"--nlist must be between 1 and the number of documents ({n_docs}), got {nlist}")
    # Shards share the one quantizer, trained as the unsharded index's: same nlist, nprobe, sample.
    if train_size is None:
        train_size = min(n_docs, POINTS_PER_LIST * nlist)
    if not nlist <= train_size <= n_docs:
        raise InvalidBuildArgument(f"train_size must be between nlist ({nlist}) and {n_docs}, got {train_size}")
    return _IvfParams(nlist=nlist, nprobe=min(nprobe, nlist), train_size=train_size)


def _result(
    kind: str, out_dir, n_docs: int, dim: int, params: _IvfParams, seed: int, started: float, shards: int,
    manifest: Manifest | None = None,
) -> BuildResult:
    db_path, index_path = output_paths(out_dir)
    return BuildResult(
        kind=kind, db_path=db_path, index_path=index_path, n_docs=n_docs, ntotal=n_docs, dim=dim,
        nlist=params.nlist, nprobe=params.nprobe, train_size=params.train_size, seed=seed,
        seconds=time.perf_counter() - started, shards=shards, manifest=manifest,
    )


def _row_batches(array: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    for start in range(0, len(array), batch_size):
        yield array[start : start + batch_size]


def _sample_rows(n: int, size: int, seed: int) -> np.ndarray:
    if size >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size, replace=False))


def _train_index(sample: np.ndarray, params: _IvfParams) -> faiss.IndexIVFFlat:
    dim = sample.shape[1]
    log.info("training IVF quantizer: %d vectors, dim %d, nlist %d", len(sample), dim, params.nlist)
    started = time.perf_counter()
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(dim), dim, params.nlist, faiss.METRIC_L2)
    index.train(np.ascontiguousarray(sample, dtype=np.float32))
    index.nprobe = params.nprobe  # stored in the file
    log.info("trained in %.1f s", time.perf_counter() - started)
    return index


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m builders.data", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build documents.db and faiss_index.bin")
    build.add_argument("--out", required=True, type=Path, help="output directory (DATA_DIR)")
    build.add_argument("--kind", choices=("course", "support"), default="course")
    build.add_argument("--docs", type=int, help=f"documents (default: course {COURSE_DOCS}, support {SUPPORT_DOCS})")
    build.add_argument("--nlist", type=int, help=f"IVF lists (default: clamp(docs // {POINTS_PER_LIST}, 1, {MAX_NLIST}))")
    build.add_argument("--nprobe", type=int, default=DEFAULT_NPROBE, help="nprobe stored in the index")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument(
        "--shards", type=int, default=1,
        help="index files over disjoint doc_ids (doc_id %% N); N > 1 writes faiss_index.shard-<k>-of-<N>.bin",
    )
    centroid_shards.add_arguments(build)
    build.add_argument("--force", action="store_true", help="overwrite existing outputs")
    build.add_argument(
        "--batch-size", type=int,
        help=f"vectors per batch for course ({COURSE_BATCH}), documents per embedding batch for support ({SUPPORT_BATCH})",
    )
    build.add_argument("--no-progress", action="store_true", help="hide progress bars")
    update = sub.add_parser("update", help="build version N+1 from version N: only changed documents embedded")
    update.add_argument("--from", dest="source", required=True, type=Path, help="the complete version N's directory")
    update.add_argument("--out", required=True, type=Path,
                        help="the new version's directory (its name is the version id), beside N's")
    update.add_argument("--changes", required=True, type=Path,
                        help="JSON lines: a document (doc_id, title, content, category) adds or replaces; "
                             '{"doc_id": N, "delete": true} deletes')
    update.add_argument("--force", action="store_true", help="overwrite an existing output directory")
    update.add_argument("--no-progress", action="store_true", help="accepted as build's (an update shows no bars)")
    return parser


def _run_build(args: argparse.Namespace) -> BuildResult:
    common = dict(nlist=args.nlist, nprobe=args.nprobe, seed=args.seed, force=args.force, progress=not args.no_progress,
                  shards=args.shards)
    if args.batch_size is not None:
        common["batch_size"] = args.batch_size
    if args.kind == "course":
        return build_course(args.out, COURSE_DOCS if args.docs is None else args.docs, **common)
    n_docs = SUPPORT_DOCS if args.docs is None else args.docs
    _ivf_params(n_docs, args.nlist, args.nprobe, None, common.get("batch_size", SUPPORT_BATCH), args.shards)
    version_of(args.out, None)
    check_outputs(args.out, args.force, args.shards)  # fail before loading the model
    embed_fn, identity = configured_embedder_fn()
    return build_support(args.out, n_docs, embed_fn, embedder=identity, **common)


def _describe(result: BuildResult) -> str:
    return (
        f"built {result.kind}: {result.n_docs} documents, {result.ntotal} x {result.dim} vectors "
        f"(nlist={result.nlist}, nprobe={result.nprobe}{f', {result.shards} shards' if result.shards > 1 else ''}) "
        f"in {result.seconds:.1f} s: data version {result.version}\n"
        f"  {result.db_path} ({result.db_bytes / 1e6:.1f} MB)\n"
        + "\n".join(f"  {path} ({path.stat().st_size / 1e6:.1f} MB)" for path in result.index_files)
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        described = run_update(args) if args.command == "update" else _describe(centroid_shards.with_centroid_shards(args, _run_build))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: partial files removed", file=sys.stderr)
        return 130
    print(described)
    return 0


if __name__ == "__main__":
    sys.exit(main())
