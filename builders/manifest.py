"""The manifest of a build (pipeline.data_version), written after every other file of it."""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from builders.build_files import QUERIES_FILENAME, BuildError, index_files, output_paths
from pipeline.data_version import (
    RANDOM_VECTORS,
    EmbedderInfo,
    Manifest,
    check_version_name,
    content_hash,
    write_manifest,
)


class InvalidVersion(BuildError, ValueError):
    pass


def version_of(out_dir: str | Path, version: str | None) -> str:
    """The version id of a build into `out_dir`: its directory's name, which `version` must equal if given
    (nodes find version X in ``<data root>/X``)."""
    name = Path(out_dir).resolve().name
    if version is not None and version != name:
        raise InvalidVersion(f"--version {version!r} must be the output directory's name ({name!r}): "
                             f"build it into {Path(out_dir).resolve().parent / version}")
    try:
        return check_version_name(name)
    except ValueError as exc:
        raise InvalidVersion(f"--out {out_dir}: {exc}") from None


def random_vectors(dim: int) -> EmbedderInfo:
    """The 'embedder' of a course build: seeded random vectors (only ids matter)."""
    return EmbedderInfo(model=RANDOM_VECTORS, source="seeded", revision=None, precision="float32", dim=dim)


def mixture_vectors(dim: int) -> EmbedderInfo:
    """The 'embedder' of a ``--vectors mixture`` course build: seeded draws of builders.mixture_vectors's model
    (named by its file's hash). Random vectors still: any embedder of the dimension may search them."""
    from builders.mixture_vectors import MODEL_PATH, model_sha256
    return EmbedderInfo(model=RANDOM_VECTORS, source=f"seeded mixture {MODEL_PATH.name} sha256:{model_sha256()[:16]}",
                        revision=None, precision="float32", dim=dim)


def configured_embedder(dim: int | None = None) -> EmbedderInfo:
    """The embedder the environment configures (what `builders.data build --kind support` embeds with),
    giving `dim`-wide vectors (default: the width its files say)."""
    from builders.standins import source_building_standins
    from pipeline.config import Settings
    from pipeline.embedder import identity
    settings = Settings.from_env()
    found = identity(settings, source_building_standins(settings))
    return found if dim is None else dataclasses.replace(found, dim=dim)


def index_parameters(params, seed: int, dim: int, kind: dict | None = None) -> dict:
    """The index parameters a manifest records (params: builders.data's nlist, nprobe and train_size; kind:
    builders.data.write_index's record of the index kind, its serving parameters and measured recall)."""
    record = {"type": "IndexIVFFlat", "metric": "L2", "dim": dim, "nlist": params.nlist, "nprobe": params.nprobe,
              "train_size": params.train_size, "seed": seed}
    return {**record, **(kind or {})}


def configured_embedder_fn() -> tuple[Callable[[list[str]], np.ndarray], EmbedderInfo]:
    """The environment's embedder, loaded, and its identity for the manifest."""
    # Imported lazily: the model stack is only needed for support builds.
    from builders.standins import source_building_standins
    from pipeline.config import Settings
    from pipeline.data_version import embedder_info
    from pipeline.embedder import Embedder
    settings = Settings.from_env()
    source = source_building_standins(settings)
    embedder = Embedder.from_settings(settings, source)
    return embedder.embed, embedder_info(source, embedder.placement.precision, embedder.dim, embedder.name)



def write_build_manifest(out_dir: str | Path, *, kind: str, embedder: EmbedderInfo, documents: int,
                         index: dict, shards: int, parent: str | None = None,
                         changes: dict[str, int] | None = None, ingest: dict | None = None) -> Manifest:
    """Hash the committed documents and write the manifest: from here on the directory is a version. The
    recall queries are named if the build kept them (builders.build_files renames them in, or removes an
    earlier build's)."""
    db_path, index_path = output_paths(out_dir)
    queries = Path(out_dir) / QUERIES_FILENAME
    manifest = Manifest(
        version=version_of(out_dir, None), content_hash=content_hash(db_path), documents=documents,
        embedder=embedder, index=index, shards=shards,
        index_files=[path.name for path in index_files(index_path, shards)],
        index_sha256={path.name: file_sha256(path) for path in index_files(index_path, shards)},
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), kind=kind, parent=parent,
        changes=dict(changes or {}), ingest=dict(ingest or {}),
        recall_queries={"file": queries.name, "sha256": file_sha256(queries)} if queries.is_file() else {})
    write_manifest(out_dir, manifest)
    return manifest


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def file_problems(version_dir: str | Path, hashes: bool = True) -> list[str]:
    """What is wrong with a version's files against its manifest: each index file it names (the shards and,
    for centroid shards, the quantizer file the workers route with) and the recall queries it names
    missing, or (``hashes``) not the bytes the build wrote; the documents missing. Empty: every file is the build's. A copy of a version is checked
    with this, not only by its manifest loading (which the manifest, copied first or last, says nothing of)."""
    from pipeline.data_version import load_version
    version_dir = Path(version_dir)
    manifest = load_version(version_dir)
    db_path, _ = output_paths(version_dir)
    problems = [] if db_path.is_file() else [f"{db_path} is missing"]
    hashes_of = dict(manifest.index_sha256)
    if manifest.recall_queries:
        hashes_of[manifest.recall_queries["file"]] = manifest.recall_queries["sha256"]
    names = list(dict.fromkeys([*manifest.index_files, *hashes_of]))
    quantizer = (manifest.sharding or {}).get("quantizer")
    if quantizer and quantizer not in names:
        names.append(quantizer)
    for name in names:
        path = version_dir / name
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif hashes and name in hashes_of and file_sha256(path) != hashes_of[name]:
            problems.append(f"{path} is not the file the build wrote (sha256 differs from the manifest's)")
    return problems


def main(argv: list[str] | None = None) -> int:
    """``python -m builders.manifest verify DIR [--no-hashes]``: exit 1, naming each problem, unless every file
    of the version in DIR is the build's."""
    import argparse
    import sys
    parser = argparse.ArgumentParser(prog="python -m builders.manifest", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    verify = sub.add_parser("verify", help="check a version's files against its manifest")
    verify.add_argument("version_dir", type=Path)
    verify.add_argument("--no-hashes", action="store_true", help="only that every file is there (no sha256)")
    args = parser.parse_args(argv)
    try:
        problems = file_problems(args.version_dir, hashes=not args.no_hashes)
    except (OSError, ValueError) as exc:  # DataVersionError: no complete manifest
        problems = [str(exc)]
    for problem in problems:
        print(f"verify: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
