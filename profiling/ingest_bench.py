"""Ingest throughput on real documents no one here wrote: documents read per second (per format) and
passages embedded per second, through builders.ingest's own reading and full build.

    python -m profiling.ingest_bench [SOURCE ...] [--max-docs 200] [--max-file-mb 50] [--batch-size 32] [--out DIR]

SOURCEs default to Python's library reference in HTML (Debian's python3-doc,
/usr/share/doc/python3/html/library) and R's manuals in PDF (Debian's r-doc-pdf, /usr/share/R/doc/manual),
those installed. At most ``--max-docs`` files are read, taken in turn from each SOURCE so that every
one is measured, a file with the bytes of one taken before left out (r-doc-pdf ships its reference
manual twice, 6.5 MB each: ``--max-file-mb 2`` skips it, as ingest skips a file over its limit);
each format's files are read on their own (documents/s and MB/s per format), then the
documents are split, embedded and indexed into a data version in a temporary folder, as
``python -m builders.ingest`` builds one. The embedder is the one the environment configures, as for
ingest and the nodes: ``EMBEDDER_MODEL`` (a repo id or a sentence-transformers folder) with
``MODEL_SOURCE``; ``MODEL_SOURCE=standin STANDIN_PROFILE=faithful`` is bge-base-en-v1.5's shape with
random weights (its embedding rate is bge-base's; its tokenizer is not bge's vocabulary). Prints a
table and writes ingest_bench.json (figures, files read, the commit and settings) under --out.
"""
from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from itertools import chain, zip_longest
from pathlib import Path
from typing import Any

from builders.build_files import BuildError
from builders.ingest.build import BuildOptions, full_build
from builders.ingest.documents import SourceDocument
from builders.ingest.embedding import DEFAULT_BATCH, configured
from builders.ingest.sources import ReadOptions, SourceFile, expand, read_sources
from builders.ingest.splitter import SplitSettings
from profiling.lib import cli
from profiling.lib.provenance import headline, local_record
from profiling.lib.report import run_folder, text_table, write_json

PYTHON_HTML = Path("/usr/share/doc/python3/html/library")  # apt-get install python3-doc
R_PDFS = Path("/usr/share/R/doc/manual")  # apt-get install r-doc-pdf (no dependencies)
DEFAULT_SOURCES = (PYTHON_HTML, R_PDFS)


def parser():
    p = cli.make_parser("python -m profiling.ingest_bench", __doc__)
    p.add_argument("sources", nargs="*", default=[], metavar="SOURCE", type=Path,
                   help="folders or files to ingest (default: those of "
                        f"{', '.join(map(str, DEFAULT_SOURCES))} that are installed)")
    p.add_argument("--max-docs", type=int, default=200, help="read at most this many files, in turn from each SOURCE")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH, help="passages per embedding batch")
    p.add_argument("--max-file-mb", type=float, default=50.0, help="files larger than this are skipped, as ingest does")
    p.add_argument("--no-progress", action="store_true", help="hide the embedding progress bar")
    cli.add_out(p, "ingest_bench")
    return p


def take_in_turn(per_source: Sequence[Sequence[SourceFile]], limit: int) -> tuple[list[SourceFile], int]:
    """At most `limit` files: the first of each source, then the second of each, and so on, a file
    whose bytes an earlier one has left out (r-doc-pdf ships refman.pdf twice); and how many were."""
    chosen, seen, repeats = [], set(), 0
    for file in chain.from_iterable(zip_longest(*per_source)):
        if file is None:
            continue
        digest = hashlib.sha256(file.path.read_bytes()).digest()
        if digest in seen:
            repeats += 1
            continue
        seen.add(digest)
        chosen.append(file)
        if len(chosen) == limit:
            break
    return chosen, repeats


def file_format(file: SourceFile) -> str:
    return file.path.suffix.lower().lstrip(".") or "none"


def run(args, progress=print) -> dict:
    sources = [str(s) for s in args.sources] or [str(s) for s in DEFAULT_SOURCES if s.exists()]
    if not sources:
        raise BuildError("none of the default sources is installed (apt-get install python3-doc r-doc-pdf): name SOURCEs")
    files, repeats = take_in_turn([expand([source])[0] for source in sources], args.max_docs)
    if repeats:
        progress(f"left out {repeats} file(s) the same as one taken before")
    options = ReadOptions(max_file_bytes=int(args.max_file_mb * 1e6))
    reading: list[dict[str, Any]] = []
    documents: list[SourceDocument] = []
    skipped: list[tuple[str, str]] = []
    for fmt in sorted({file_format(f) for f in files}):
        chosen = [f for f in files if file_format(f) == fmt]
        started = time.perf_counter()
        read = read_sources(chosen, options)
        seconds = time.perf_counter() - started
        left_out = {where for where, _ in read.skipped}
        size = sum(f.path.stat().st_size for f in chosen if str(f.path) not in left_out)  # the bytes read
        reading.append({"format": fmt, "files": len(chosen), "documents": len(read.documents), "bytes": size,
                        "seconds": seconds, "documents_per_s": len(read.documents) / seconds if seconds else 0.0,
                        "mb_per_s": size / 1e6 / seconds if seconds else 0.0})
        documents += read.documents
        skipped += [(where, str(skip)) for where, skip in read.skipped]
        progress(f"read {len(read.documents)} {fmt} documents of {len(chosen)} files in {seconds:.1f} s")
    if not documents:
        raise BuildError("no document could be read from " + " ".join(sources))
    started = time.perf_counter()
    embedder = configured()
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    embedder.embed(["a first call, whose one-time costs stay out of the embedding rate"])
    warm_s = time.perf_counter() - started
    progress(f"embedder {embedder.identity.model} ({embedder.identity.source}) loaded in {load_s:.1f} s")
    split = SplitSettings(limit=embedder.limit, target=256, overlap=32)
    out = Path(tempfile.mkdtemp(prefix="ingest-bench-")) / "v1"
    try:
        built = full_build(out, documents, embedder, split,
                           BuildOptions(force=True, progress=not args.no_progress, batch_size=args.batch_size),
                           {"sources": sources})
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
    read_s = sum(r["seconds"] for r in reading)
    return {
        "sources": sources, "files": [str(f.path) for f in files], "repeats_left_out": repeats, "skipped": skipped,
        "reading": reading,
        "documents": len(documents), "read_seconds": read_s,
        "documents_per_s": len(documents) / read_s if read_s else 0.0,
        "embedder": {"model": embedder.identity.model, "source": embedder.identity.source,
                     "precision": embedder.identity.precision, "dim": embedder.identity.dim, "limit": embedder.limit,
                     "load_seconds": load_s, "warm_up_seconds": warm_s},
        "passages": built.passages, "split_seconds": built.split_seconds, "embed_seconds": built.embed_seconds,
        "passages_per_s": built.embedded / built.embed_seconds if built.embed_seconds else 0.0,
        "build_seconds": built.seconds,
    }


def format_report(result: dict) -> str:
    rows = [(r["format"], r["files"], r["documents"], f"{r['bytes'] / 1e6:.1f}", f"{r['seconds']:.1f}",
             f"{r['documents_per_s']:.1f}", f"{r['mb_per_s']:.2f}") for r in result["reading"]]
    table = text_table([("format", "<8"), ("files", ">7"), ("documents", ">11"), ("MB", ">8"), ("read s", ">9"),
                        ("documents/s", ">13"), ("MB/s", ">8")], rows)
    e = result["embedder"]
    skipped = [f"skipped {where}: {why}" for where, why in result["skipped"]]
    return "\n".join([
        table, *skipped,
        f"read: {result['documents']} documents in {result['read_seconds']:.1f} s "
        f"({result['documents_per_s']:.1f} documents/s)",
        f"embedder: {e['model']} ({e['source']}, {e['precision']}, {e['dim']} dims, passages up to {e['limit']} tokens), "
        f"loaded in {e['load_seconds']:.1f} s, its first call {e['warm_up_seconds']:.1f} s",
        f"passages: {result['passages']} split in {result['split_seconds']:.1f} s, embedded in "
        f"{result['embed_seconds']:.1f} s ({result['passages_per_s']:.1f} passages/s); "
        f"the whole build {result['build_seconds']:.1f} s",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.max_docs < 1 or args.batch_size < 1 or args.max_file_mb <= 0:
        print("ingest_bench: --max-docs and --batch-size must be >= 1, --max-file-mb > 0", file=sys.stderr)
        return 2
    try:
        result = run(args, lambda line: print(line, file=sys.stderr, flush=True))
    except BuildError as exc:
        print(f"ingest_bench: {exc}", file=sys.stderr)
        return 2
    record = local_record()
    out = run_folder("ingest_bench", args.out) / "ingest_bench.json"
    write_json(out, {"args": vars(args), "record": record, **result})
    print(headline(record))
    print(format_report(result))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
