"""``python -m builders.ingest SOURCE... --out DATA/<version> [--from DATA/<previous>]`` (``./run.sh ingest``).

Reads every SOURCE (a folder, walked recursively; a file; a glob), splits the documents into passages
in the embedder's tokens and writes the data version DATA/<version>; with ``--from`` only what changed
since that version is embedded. Each skipped file or record is reported on a line of its own with the
reason, then a count by reason; ``--strict`` makes any skip an error (exit 1) before anything is built.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path

from builders.build_files import BuildError
from builders.ingest.build import DEFAULT_RETRAIN_SHARE, BuildOptions, IngestResult, full_build, next_version
from builders.ingest.embedding import DEFAULT_BATCH, IngestEmbedder
from builders.ingest.records import RecordFields
from builders.ingest.sources import DEFAULT_MAX_FILE_BYTES, ReadOptions, ReadResult, expand, read_sources
from builders.ingest.splitter import SplitSettings

EXIT_SKIPPED = 1
EXIT_BAD_ARGUMENT = 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m builders.ingest", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="a folder (walked recursively), a file or a glob")
    p.add_argument("--out", required=True, type=Path, help="the new version's directory (its name is the version id)")
    p.add_argument("--from", dest="previous", type=Path,
                   help="the previous ingest's version: only added and changed documents are embedded")
    p.add_argument("--strict", action="store_true", help="fail (exit 1) if any source would be skipped")
    p.add_argument("--force", action="store_true", help="overwrite an existing version in --out")
    p.add_argument("--target-tokens", type=int, default=256, help="a passage's size to aim at, in the embedder's tokens")
    p.add_argument("--overlap-tokens", type=int, default=32, help="tokens a passage repeats of the one before it")
    p.add_argument("--max-tokens", type=int,
                   help="the longest passage (default and upper bound: the embedder's limit, 512 for bge)")
    p.add_argument("--max-file-mb", type=float, default=DEFAULT_MAX_FILE_BYTES / 1e6,
                   help="files larger than this are skipped")
    p.add_argument("--id-field", default="id", help="JSON lines/CSV: the field holding a record's id")
    p.add_argument("--title-field", default="title", help="JSON lines/CSV: the field holding its title")
    p.add_argument("--text-field", default="text", help="JSON lines/CSV: the field holding its text")
    p.add_argument("--url-field", default="url", help="JSON lines/CSV: the field holding its URL")
    p.add_argument("--base-url", help="a file's URL is this followed by its id, where the file names none")
    p.add_argument("--shards", type=int, default=1, help="index files (a --from build keeps the previous count)")
    p.add_argument("--nlist", type=int, help="IVF lists (default: clamp(passages // 39, 1, 4096))")
    p.add_argument("--nprobe", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH, help="passages per embedding batch")
    p.add_argument("--retrain-share", type=float, default=DEFAULT_RETRAIN_SHARE,
                   help="with --from: train the quantizer again (a full build) once the vectors added and removed "
                        "since it was trained pass this share of those it was trained on")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return p


def report_skips(result: ReadResult, out=None) -> None:
    out = out or sys.stderr
    for where, skip in result.skipped:
        print(f"skipped {where}: {skip}", file=out)
    if result.skipped:
        summary = ", ".join(f"{reason} {count}" for reason, count in sorted(result.skipped_by_reason().items()))
        print(f"skipped {len(result.skipped)} source(s): {summary}", file=out)


def _parsers() -> dict[str, str]:
    found = {}
    for fmt, package in (("html", "selectolax"), ("pdf", "pypdf")):
        try:
            found[fmt] = f"{package} {package_version(package)}"
        except PackageNotFoundError:
            found[fmt] = f"{package} (not installed)"
    return found


def run(args: argparse.Namespace, embedder_factory=None) -> tuple[IngestResult | None, ReadResult]:
    """Read, then build; `embedder_factory()` gives the IngestEmbedder (default: the configured one)."""
    if args.retrain_share <= 0 or args.batch_size < 1 or args.max_file_mb <= 0:
        raise BuildError("--retrain-share and --max-file-mb must be > 0 and --batch-size >= 1")
    files, other = expand(args.sources)
    options = ReadOptions(max_file_bytes=int(args.max_file_mb * 1e6),
                          fields=RecordFields(args.id_field, args.title_field, args.text_field, args.url_field),
                          base_url=args.base_url)
    started = time.perf_counter()
    read = read_sources(files, options)
    read.seconds = time.perf_counter() - started
    read.other_files = other
    report_skips(read)
    if read.skipped and args.strict:
        return None, read
    if not read.documents:
        raise BuildError("no document could be read from " + " ".join(args.sources))
    if embedder_factory is None:
        from builders.ingest.embedding import configured
        embedder_factory = configured
    embedder: IngestEmbedder = embedder_factory()
    if args.max_tokens is not None and not 8 <= args.max_tokens <= embedder.limit:
        raise BuildError(f"--max-tokens must be between 8 and the embedder's limit ({embedder.limit}), "
                         f"got {args.max_tokens}")
    try:
        split = SplitSettings(limit=args.max_tokens or embedder.limit, target=args.target_tokens,
                              overlap=args.overlap_tokens)
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    formats: dict[str, int] = {}
    for document in read.documents:
        formats[document.format] = formats.get(document.format, 0) + 1
    record = {"sources": list(args.sources), "formats": formats, "split": split.as_json(), "parsers": _parsers(),
              "skipped": dict(read.skipped_by_reason()), "other_files": other}
    build = BuildOptions(force=args.force, progress=not args.no_progress, shards=args.shards, nlist=args.nlist,
                         nprobe=args.nprobe, seed=args.seed, batch_size=args.batch_size,
                         retrain_share=args.retrain_share)
    if args.previous is None:
        return full_build(args.out, read.documents, embedder, split, build, record), read
    return next_version(args.previous, args.out, read.documents, embedder, split, build, record), read


def describe(result: IngestResult, read: ReadResult) -> str:
    m = result.manifest
    lines = [f"ingested {result.documents} documents into {result.passages} passages: data version {m.version}"
             + (f" (from {m.parent})" if m.parent else "")]
    if m.parent or result.retrained:
        lines.append(f"  documents: {result.added} added, {result.changed} changed, {result.deleted} deleted, "
                     f"{result.unchanged} unchanged")
    if result.retrained:
        lines.append(f"  quantizer trained again (a full build): {result.retrained}")
    reading = len(read.documents) / read.seconds if read.seconds > 0 else 0.0
    lines.append(f"  documents read: {len(read.documents)} in {read.seconds:.1f} s ({reading:.1f} documents/s)")
    embed_rate = result.embedded / result.embed_seconds if result.embed_seconds > 0 else 0.0
    lines.append(f"  passages embedded: {result.embedded} in {result.embed_seconds:.1f} s ({embed_rate:.1f} passages/s); "
                 f"split {result.split_seconds:.1f} s, the whole build {result.seconds:.1f} s")
    if read.other_files:
        lines.append(f"  {read.other_files} file(s) in the folders were of no document format and not read")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, embedder_factory=None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        result, read = run(args, embedder_factory)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT
    except KeyboardInterrupt:
        print("interrupted: partial files removed, no version written", file=sys.stderr)
        return 130
    if result is None:
        print(f"error: --strict: {len(read.skipped)} source(s) would be skipped: "
              + ", ".join(where for where, _ in read.skipped), file=sys.stderr)
        return EXIT_SKIPPED
    print(describe(result, read))
    return 0
