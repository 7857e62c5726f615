"""Build the document database and FAISS index that the service reads, as a data version.

    python -m builders.data build --out DIR --kind {course,support} [--docs N] [--index SPEC|auto] [--vectors mixture]
        [--nlist N] [--nprobe 64] [--seed 0] [--shards 1] [--force] [--batch-size B]
        [--min-recall F] [--accept-low-recall] [--tune] [--recall-queries 1000]
    python -m builders.data update --from DIR_N --out DIR_N+1 --changes FILE.jsonl   (builders.incremental)

Every build is a data version (pipeline.data_version): ``DIR/manifest.json``, written last, names it
(the directory's name), its content hash, documents, embedder, index parameters and shard layout.

writes ``DIR/documents/documents.db`` and an index (L2, 768-d; ``--index``: builders.index_kinds, default
``IVF{n},Flat``; ``auto``: builders.auto_index) whose ids are the doc_ids:
``DIR/faiss_index.bin``, or with ``--shards N`` the N files ``pipeline.shards.shard_path`` names, shard
k holding the doc_ids with ``doc_id % N == k``. Shards share the quantizer the unsharded build would
train, so a merged search over them equals the unsharded one (:mod:`pipeline.shards`).

* ``course``: the course rows (``Document {i}``) over seeded random vectors: uniform in the cube
  (``--vectors uniform``, the course's), or ``--vectors mixture``, drawn like real embeddings
  (builders.mixture_vectors; IVF recall and centroid-shard fan-out then behave as on real data).
* ``support``: the articles of :mod:`builders.corpus`, their ``content`` embedded with the configured
  embedder.

nlist defaults to ``clamp(N // 39, 1, 4096)`` (faiss wants ~39 training points per list); the stored
nprobe is ``min(nprobe, nlist)``. The index files are streamed by :mod:`builders.ivf_writer` (peak
memory: the training sample plus one batch), byte-identical to ``faiss.write_index`` of the same
vectors in memory, and :mod:`builders.build_files` renames every file into place only after a
complete build. Every build measures its recall@10 against an exact search (builders.recall) before
its manifest is written, and fails under the floor (INDEX_MIN_RECALL, ``--min-recall``) unless told to
accept it (``--accept-low-recall``); ``--tune`` first raises nprobe / efSearch to the floor. Its queries
are kept in ``DIR/recall_queries.npz``, so ``python -m builders.recall tune DIR`` can re-tune it later.
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

import numpy as np

from builders import centroid_shards
from builders.auto_index import choose_index
from builders.build_files import (
    BuildError,
    check_outputs,
    chunks,
    db_writer,
    index_files,
    output_paths,
    staged_outputs,
    staged_queries,
)
from builders.corpus import course_document, support_documents
from builders.embedding import write_and_embed
from builders.incremental import run_update
from builders.index_kinds import (
    DEFAULT_INDEX,
    MAX_NLIST,
    POINTS_PER_LIST,
    InvalidBuildArgument,
    IvfParams,
    default_nlist,
    ivf_params,
    kind_record,
    parse_index_spec,
    row_batches,
    sample_rows,
    train_ivfflat,
    trained_index,
    write_in_memory,
)
from builders.ivf_writer import write_ivfflat
from builders.manifest import (
    configured_embedder,
    configured_embedder_fn,
    index_parameters,
    mixture_vectors,
    random_vectors,
    version_of,
    write_build_manifest,
)
from builders.mixture_vectors import MIXTURE, UNIFORM, VECTOR_SOURCES, course_vector_batches
from builders.recall import RecallOptions, add_recall_arguments, measure_build, recall_options
from pipeline.data_version import EmbedderInfo, Manifest
from pipeline.spec import EMBED_DIM

log = logging.getLogger(__name__)

EmbedFn = Callable[[list[str]], np.ndarray]
Batches = Callable[[], Iterator[np.ndarray]]

AUTO = "auto"
COURSE_DOCS = 4_500_000
SUPPORT_DOCS = 5_000
DEFAULT_NPROBE = 64
COURSE_BATCH = 65_536
SUPPORT_BATCH = 256
__all__ = ["InvalidBuildArgument", "MAX_NLIST", "POINTS_PER_LIST", "default_nlist", "build_course", "build_support",
           "course_vector_batches"]
# builders.ingest and the tests build through these names
_ivf_params, _row_batches, _sample_rows, _train_index = ivf_params, row_batches, sample_rows, train_ivfflat
_IvfParams = IvfParams


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
    def recall(self) -> dict | None:
        return self.manifest.index.get("recall") if self.manifest is not None else None

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


def write_index(paths: list[Path], spec: str, params: IvfParams, sample: np.ndarray, batches: Batches, n: int,
                progress: bool, recall: RecallOptions, seed: int, keep: Path | None = None) -> dict:
    """The index files of one build, of kind ``spec`` (``auto``: builders.auto_index's choice), and the
    manifest's record of them with their measured recall (LowRecall under the floor; ``keep``: measure_build's)."""
    auto = None
    if spec == AUTO:
        spec, auto = choose_index(sample, n, recall.min_recall, recall.latency_budget_ms, seed)
        params = ivf_params(n, None, params.nprobe, None, n, len(paths), parse_index_spec(spec, sample.shape[1]))
    kind = parse_index_spec(spec, sample.shape[1])
    if kind.streamed:
        write_ivfflat(paths, train_ivfflat(sample, params), batches, n, progress)
    else:
        write_in_memory(paths, trained_index(kind, sample, params), batches, n)
    report = measure_build(paths, batches, n, recall, seed, keep=keep)
    # report.params: the serving parameters measured (what --tune chose, if it ran)
    return {**kind_record(kind, params), **report.params, "recall": report.to_json(), **({"auto": auto} if auto else {})}


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
    index: str = DEFAULT_INDEX,
    recall: RecallOptions | None = None,
    vectors: str = UNIFORM,
) -> BuildResult:
    """Course rows and an index of seeded random vectors (or ``shards`` of them), streamed in batches:
    ``vectors`` uniform in the cube or drawn from the embedding-shaped mixture (course_vector_batches)."""
    params = ivf_params(n_docs, nlist, nprobe, train_size, batch_size, shards, _kind(index, dim))
    version_of(out_dir, None)
    started = time.perf_counter()
    with staged_outputs(out_dir, force, shards) as (db_tmp, index_tmps):
        rows = (course_document(i).as_row() for i in range(n_docs))
        with db_writer(db_tmp) as insert:
            for chunk in chunks(rows, batch_size, n_docs, "documents", progress):
                insert(chunk)
        # The stream is i.i.d., so its first vectors are a fair training sample.
        sample = next(course_vector_batches(params.train_size, dim, seed, params.train_size, vectors))
        batches = partial(course_vector_batches, n_docs, dim, seed, batch_size, vectors)
        kind = write_index(index_tmps, index, params, sample, batches, n_docs, progress, recall or RecallOptions(), seed,
                           staged_queries(out_dir))
    identity = mixture_vectors(dim) if vectors == MIXTURE else random_vectors(dim)
    manifest = write_build_manifest(out_dir, kind="course", embedder=identity, documents=n_docs,
                                    index=index_parameters(params, seed, dim, kind), shards=shards)
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
    index: str = DEFAULT_INDEX,
    recall: RecallOptions | None = None,
) -> BuildResult:
    """Support articles and an index (or ``shards`` of them) of their ``content`` embeddings.

    ``embed_fn(texts) -> (len(texts), d) float32`` is called once per batch of
    ``batch_size`` documents; the embeddings are kept in memory (3 KB per
    document at d=768), since recomputing them for the second pass would cost
    far more. ``embedder`` names what ``embed_fn`` computes, for the manifest (default: the embedder
    the environment configures, which the CLI embeds with).
    """
    params = ivf_params(n_docs, nlist, nprobe, train_size, batch_size, shards)
    version_of(out_dir, None)
    started = time.perf_counter()
    with staged_outputs(out_dir, force, shards) as (db_tmp, index_tmps):
        vectors = write_and_embed(db_tmp, support_documents(n_docs, seed), n_docs, embed_fn, batch_size, progress)
        params = ivf_params(n_docs, nlist, nprobe, train_size, batch_size, shards, _kind(index, vectors.shape[1]))
        kind = write_index(index_tmps, index, params, vectors[sample_rows(n_docs, params.train_size, seed)],
                              partial(row_batches, vectors, batch_size), n_docs, progress,
                              recall or RecallOptions(), seed, staged_queries(out_dir))
    dim = vectors.shape[1]
    identity = dataclasses.replace(embedder or configured_embedder(dim), dim=dim)
    manifest = write_build_manifest(out_dir, kind="support", embedder=identity, documents=n_docs,
                                    index=index_parameters(params, seed, dim, kind), shards=shards)
    return _result("support", out_dir, n_docs, dim, params, seed, started, shards, manifest)


def _kind(spec: str, dim: int):
    return None if spec == AUTO else parse_index_spec(spec, dim)


def _result(
    kind: str, out_dir, n_docs: int, dim: int, params: IvfParams, seed: int, started: float, shards: int,
    manifest: Manifest | None = None,
) -> BuildResult:
    db_path, index_path = output_paths(out_dir)
    return BuildResult(
        kind=kind, db_path=db_path, index_path=index_path, n_docs=n_docs, ntotal=n_docs, dim=dim,
        nlist=params.nlist, nprobe=params.nprobe, train_size=params.train_size, seed=seed,
        seconds=time.perf_counter() - started, shards=shards, manifest=manifest,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m builders.data", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build documents.db and faiss_index.bin")
    build.add_argument("--out", required=True, type=Path, help="output directory (DATA_DIR)")
    build.add_argument("--kind", choices=("course", "support"), default="course")
    build.add_argument("--docs", type=int, help=f"documents (default: course {COURSE_DOCS}, support {SUPPORT_DOCS})")
    build.add_argument("--index", default=DEFAULT_INDEX,
                       help="index kind, a faiss index_factory string: IVF{n},Flat (default; n from --nlist), "
                            "IVF{n},SQ8, IVF{n},PQ{m}, OPQ{m},IVF{n},PQ{m}, HNSW{M},Flat; or auto (builders.auto_index)")
    build.add_argument("--vectors", choices=VECTOR_SOURCES, default=UNIFORM,
                       help="course vectors: uniform in [0, 1) (the course's own), or mixture: unit vectors drawn like "
                            "real embeddings' (builders.mixture_vectors)")
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
    add_recall_arguments(build)
    update = sub.add_parser("update", help="build version N+1 from version N: only changed documents embedded")
    update.add_argument("--from", dest="source", required=True, type=Path, help="the complete version N's directory")
    update.add_argument("--out", required=True, type=Path,
                        help="the new version's directory (its name is the version id), beside N's")
    update.add_argument("--changes", required=True, type=Path,
                        help="JSON lines: a document (doc_id, title, content, category) adds or replaces; "
                             '{"doc_id": N, "delete": true} deletes')
    update.add_argument("--force", action="store_true", help="overwrite an existing output directory")
    update.add_argument("--no-progress", action="store_true", help="accepted as build's (an update shows no bars)")
    add_recall_arguments(update, with_tune=False)
    return parser


def _run_build(args: argparse.Namespace) -> BuildResult:
    common = dict(nlist=args.nlist, nprobe=args.nprobe, seed=args.seed, force=args.force, progress=not args.no_progress,
                  shards=args.shards, index=args.index, recall=recall_options(args))
    if args.batch_size is not None:
        common["batch_size"] = args.batch_size
    n_docs = (COURSE_DOCS if args.kind == "course" else SUPPORT_DOCS) if args.docs is None else args.docs
    if args.kind == "course":
        return build_course(args.out, n_docs, vectors=args.vectors, **common)
    if args.vectors != UNIFORM:
        raise InvalidBuildArgument("--vectors is for --kind course: support builds embed their articles")
    ivf_params(n_docs, args.nlist, args.nprobe, None, common.get("batch_size", SUPPORT_BATCH), args.shards,
               _kind(args.index, EMBED_DIM))
    version_of(args.out, None)
    check_outputs(args.out, args.force, args.shards)  # fail before loading the model
    embed_fn, identity = configured_embedder_fn()
    return build_support(args.out, n_docs, embed_fn, embedder=identity, **common)


def _describe(result: BuildResult) -> str:
    recall = result.recall or {}
    return (
        f"built {result.kind}: {result.n_docs} documents, {result.ntotal} x {result.dim} vectors "
        f"({result.manifest.index.get('spec') if result.manifest else ''}, "
        f"nlist={result.nlist}, nprobe={result.nprobe}{f', {result.shards} shards' if result.shards > 1 else ''}) "
        f"in {result.seconds:.1f} s: data version {result.version}\n"
        f"  recall@10 {recall.get('overall')} (shards {recall.get('shards')}, floor {recall.get('floor')}, "
        f"{recall.get('params')})\n"
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
