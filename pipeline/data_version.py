"""A data version: one build's documents and index, named by the manifest written beside them.

A version directory holds ``manifest.json``, ``documents/documents.db``, the index file(s)
(``faiss_index.bin``, or one per shard: pipeline.shards) and the queries its recall was measured on
(``recall_queries.npz``). The builder writes the manifest last (and
removes an old one first when it rebuilds in place), so a directory with a manifest is a complete
build and one without is not, whatever killed the build. Versions live side by side in one folder, the
data root (``DATA/v1``, ``DATA/v2``), which may also hold a link (``DATA/current -> v2``) that
FAISS_INDEX_PATH and DOCUMENTS_DIR go through: a node that switches versions repoints it, so a
restarted node comes back on the version it last served.

The manifest names the embedder that built the index; a worker whose embedder is another refuses it
(:func:`embedder_mismatch`), so swapping stand-ins for the real models never silently searches with
vectors from another model. Pure: no threads, no HTTP.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError
from pipeline.spec import DOCUMENTS_COLUMNS, DOCUMENTS_TABLE

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
# The embedder of a course build: seeded random vectors, no model; any embedder of its dimension may search it.
RANDOM_VECTORS = "random-vectors"


class DataVersionError(ConfigError):
    """A version directory that cannot be served: incomplete, unreadable, or built for another embedder."""


@dataclass(frozen=True)
class EmbedderInfo:
    """Which embedder made an index's vectors (or searches one): the model, where its weights came
    from (``hub``, ``standin:tiny``), their revision, the precision it computed in and its dimension."""
    model: str
    source: str
    revision: str | None
    precision: str
    dim: int

    def describe(self) -> str:
        revision = f"@{self.revision[:12]}" if self.revision else ""
        return f"{self.model}{revision} ({self.source}, {self.precision}, {self.dim}-d)"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EmbedderInfo:
        return cls(model=str(data["model"]), source=str(data["source"]), revision=data.get("revision"),
                   precision=str(data["precision"]), dim=int(data["dim"]))


def embedder_mismatch(built: EmbedderInfo, ours: EmbedderInfo) -> list[str]:
    """How `ours` differs from the embedder that `built` an index, in what matters to its vectors: the
    model, its weights (source and revision) and the dimension. Precision is not among them: the same
    weights in bfloat16 or int8 give vectors within rounding of float32's. A course index (random vectors)
    only needs the dimension."""
    differences = []
    if built.dim != ours.dim:
        differences.append(f"dimension {built.dim} vs {ours.dim}")
    if built.model == RANDOM_VECTORS:
        return differences
    if built.model != ours.model:
        differences.append(f"model {built.model} vs {ours.model}")
    if built.source != ours.source:
        differences.append(f"weights from {built.source} vs {ours.source}")
    elif built.revision and ours.revision and built.revision != ours.revision:
        differences.append(f"revision {built.revision} vs {ours.revision}")
    return differences


@dataclass(frozen=True)
class Manifest:
    """What one build wrote: ``version`` (its id; the directory's name), ``content_hash`` (sha256 of the
    documents table, rows in doc_id order), the embedder, the index parameters and the shard layout
    (with each index file's sha256).
    ``parent``: the version an incremental build started from, with what it changed.
    ``ingest``: for a build of one's own documents (builders.ingest), what was read and how it was split."""
    version: str
    content_hash: str
    documents: int
    embedder: EmbedderInfo
    index: dict[str, Any]
    shards: int
    index_files: list[str]
    created: str
    kind: str
    parent: str | None = None
    changes: dict[str, int] = field(default_factory=dict)
    index_sha256: dict[str, str] = field(default_factory=dict)  # each index file's, by name
    format: int = MANIFEST_FORMAT
    ingest: dict[str, Any] = field(default_factory=dict)
    # How the shards split the index: empty for doc_id % N; a centroid layout's owners (pipeline.centroid_routing).
    sharding: dict[str, Any] = field(default_factory=dict)
    # The recall check's queries and their exact answers kept beside the index (builders.recall_queries):
    # {"file": name, "sha256": hex}; empty for a version built before they were kept.
    recall_queries: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        return cls(version=str(data["version"]), content_hash=str(data["content_hash"]),
                   documents=int(data["documents"]), embedder=EmbedderInfo.from_json(data["embedder"]),
                   index=dict(data["index"]), shards=int(data["shards"]), index_files=list(data["index_files"]),
                   created=str(data["created"]), kind=str(data["kind"]), parent=data.get("parent"),
                   changes=dict(data.get("changes") or {}), index_sha256=dict(data.get("index_sha256") or {}),
                   format=int(data.get("format", MANIFEST_FORMAT)), ingest=dict(data.get("ingest") or {}),
                   sharding=dict(data.get("sharding") or {}), recall_queries=dict(data.get("recall_queries") or {}))


def manifest_path(version_dir: str | Path) -> Path:
    return Path(version_dir) / MANIFEST_NAME


def read_manifest(version_dir: str | Path) -> Manifest:
    """The manifest of a complete version directory; DataVersionError naming what is wrong otherwise."""
    path = manifest_path(version_dir)
    if not path.is_file():
        raise DataVersionError(f"{version_dir} holds no {MANIFEST_NAME}: not a complete data build (a build "
                               "writes it last); build it with `python -m builders.data build --out DIR ...`")
    try:
        manifest = Manifest.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataVersionError(f"{path} is not a readable data manifest: {exc}") from exc
    if manifest.format != MANIFEST_FORMAT:
        raise DataVersionError(f"{path} has manifest format {manifest.format}; this code reads {MANIFEST_FORMAT}")
    return manifest


def write_manifest(version_dir: str | Path, manifest: Manifest) -> Path:
    """Write the manifest atomically (a temporary file, fsynced, renamed over, the directory fsynced):
    a reader sees the whole manifest or none."""
    path = manifest_path(version_dir)
    temp = path.with_name(f".{MANIFEST_NAME}.partial")
    with open(temp, "w") as out:
        json.dump(manifest.to_json(), out, indent=2, sort_keys=True)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, path)
    fsync_dir(path.parent)
    return path


def remove_manifest(version_dir: str | Path) -> None:
    """Mark a directory incomplete before its files are replaced (durably: the rename that follows must
    not reach the disk before this does)."""
    path = manifest_path(version_dir)
    if path.exists():
        path.unlink()
        fsync_dir(path.parent)


def fsync_dir(path: str | Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # not every platform can fsync a directory
        pass
    finally:
        os.close(fd)


def content_hash(db_path: str | Path) -> str:
    """sha256 of the documents table: every row in doc_id order, each column's text length-prefixed."""
    digest = hashlib.sha256()
    conn = sqlite3.connect(f"{Path(db_path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(f"SELECT {', '.join(DOCUMENTS_COLUMNS)} FROM {DOCUMENTS_TABLE} ORDER BY doc_id")
        for row in rows:
            for value in row:
                text = str(value).encode()
                digest.update(len(text).to_bytes(8, "little"))
                digest.update(text)
    finally:
        conn.close()
    return digest.hexdigest()


# ------------------------------------------------------------------ where versions lie


def version_dir_of(path: str | Path) -> Path:
    """The version directory a node's FAISS_INDEX_PATH or DOCUMENTS_DIR lies in (its parent), as
    configured: through a ``current`` link if the path goes through one."""
    return Path(path).parent


def data_root_of(path: str | Path) -> Path:
    """The folder the versions lie side by side in: the real parent of the version directory."""
    return version_dir_of(path).resolve().parent


def check_version_name(version: str) -> str:
    """A version id is a directory name: no separators, not hidden, not empty."""
    if not isinstance(version, str) or not version or version.startswith(".") or "/" in version \
            or "\\" in version or version in ("..", "current") or len(version) > 200:
        raise ValueError(f"a data version is a directory name (not hidden, no '/', not 'current'), got {version!r}")
    return version


def load_version(version_dir: str | Path) -> Manifest:
    """The manifest of the version in `version_dir`; DataVersionError if it is incomplete or names
    another version than its directory's name (a copied or renamed build)."""
    version_dir = Path(version_dir)
    manifest = read_manifest(version_dir)
    real = version_dir.resolve().name
    if manifest.version != real:
        raise DataVersionError(f"{version_dir} holds version {manifest.version!r} by its manifest but is named "
                               f"{real!r}: a version lies in the directory of its own name")
    return manifest


def repoint_link(configured: str | Path, version: str) -> bool:
    """If `configured`'s version directory is a link (``DATA/current``), point it at `version` atomically
    (a new link renamed over it), so a restart comes back on it. False when it is no link or cannot be
    written (a read-only volume): the node then restarts on the version its settings name."""
    link = version_dir_of(configured)
    if not link.is_symlink():
        return False
    temp = link.with_name(f".{link.name}.{os.getpid()}.partial")
    try:
        temp.unlink(missing_ok=True)
        os.symlink(check_version_name(version), temp)
        os.replace(temp, link)
        fsync_dir(link.parent)
    except OSError:
        with contextlib.suppress(OSError):  # a read-only volume refuses even to remove what is not there
            temp.unlink(missing_ok=True)
        return False
    return True


# ------------------------------------------------------------------ which embedder a node runs


def embedder_revision(cache_dir: Path | None, model: str | None = None) -> str | None:
    """The snapshot revision the hub cache resolves the embedder to (its ``refs/main``), if known."""
    from pipeline.models import hub_cache_dir, hub_repo_folder
    from pipeline.spec import EMBEDDER_MODEL
    ref = (cache_dir or hub_cache_dir()) / hub_repo_folder(model or EMBEDDER_MODEL) / "refs" / "main"
    try:
        return ref.read_text().strip() or None
    except OSError:
        return None


def folder_revision(folder: str | Path) -> str:
    """A model folder's weights named by their content (sha256 over its weight files, by name): a folder
    has no hub revision, and the same path may hold other weights tomorrow."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.suffix in (".safetensors", ".bin")):
        digest.update(path.relative_to(folder).as_posix().encode())
        with open(path, "rb") as weights:
            while chunk := weights.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def embedder_info(source, precision: str, dim: int, model: str | None = None) -> EmbedderInfo:
    """The identity of the embedder `model` (default: the contract's) that a ModelSource loads (pipeline.models),
    computing in `precision`, giving `dim`-wide vectors; a model in a folder is ``folder`` and its weights' hash."""
    from pipeline.spec import EMBEDDER_MODEL
    model = model or EMBEDDER_MODEL
    if Path(model).is_dir():
        return EmbedderInfo(model=model, source="folder", revision=folder_revision(model), precision=precision, dim=dim)
    # A real model's pinned commit (what it was loaded at); a stand-in's snapshot otherwise.
    revision = source.revision(model) or embedder_revision(source.cache_dir, model)
    return EmbedderInfo(model=model, source=source.describe(), revision=revision,
                        precision=precision, dim=dim)


def check_embedder(manifest: Manifest, ours: EmbedderInfo, where: str | Path) -> None:
    """DataVersionError (exit 2 at startup) naming both embedders if `ours` cannot search this version."""
    differences = embedder_mismatch(manifest.embedder, ours)
    if differences:
        raise DataVersionError(
            f"data version {manifest.version!r} in {where} was built by the embedder {manifest.embedder.describe()}, "
            f"but this worker's embedder is {ours.describe()} ({'; '.join(differences)}): its searches would return "
            "noise. Rebuild the data with this embedder (python -m builders.data build), or set EMBEDDER_MODEL and "
            "MODEL_SOURCE (and STANDIN_PROFILE) to the embedder that built it")


# ------------------------------------------------------------------ the index's measured recall


def shard_recall(manifest: Manifest, shard: int) -> float | None:
    """The recall@10 the build measured for one shard (builders.recall), None for a version built before."""
    shards = (manifest.index.get("recall") or {}).get("shards") or []
    return float(shards[shard]) if 0 <= shard < len(shards) else None


def overall_recall(manifest: Manifest) -> float | None:
    """The recall@10 of the merged search over every shard, as the build measured it."""
    overall = (manifest.index.get("recall") or {}).get("overall")
    return float(overall) if overall is not None else None


def serving_params(manifest: Manifest, nprobe: int | None, ef_search: int | None) -> tuple[int | None, int | None]:
    """nprobe and efSearch to serve with: the settings' where set, else the manifest's (what recall was
    measured at); None where neither says (the file's stored value)."""
    recorded = manifest.index
    return (nprobe if nprobe is not None else recorded.get("nprobe"),
            ef_search if ef_search is not None else recorded.get("ef_search"))
