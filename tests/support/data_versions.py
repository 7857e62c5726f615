"""A data version's directory as the nodes and tools recognise it, without a build: its manifest alone
(pipeline.data_version.load_version reads nothing else), for tests of what lays versions out and links them."""
from __future__ import annotations

import datetime
import hashlib
from pathlib import Path

from pipeline.data_version import EmbedderInfo, Manifest, write_manifest

TINY_EMBEDDER = EmbedderInfo("BAAI/bge-base-en-v1.5", "standin:tiny", None, "float32", 768)


def manifest_only_version(root: Path, version: str) -> Path:
    """root/version holding only a manifest that names it: complete, as far as a manifest says."""
    (root / version).mkdir(parents=True)
    write_manifest(root / version, Manifest(
        version=version, content_hash="0" * 64, documents=1, embedder=TINY_EMBEDDER, index={}, shards=2,
        index_files=[], created=datetime.datetime.now(datetime.timezone.utc).isoformat(), kind="support"))
    return root / version


def version_with_files(root: Path, version: str, index: dict[str, bytes]) -> Path:
    """root/version with a documents database, the index files `index` gives (name: bytes) and a manifest
    naming them with their sha256: what `python -m builders.manifest verify` checks, without a build."""
    (root / version / "documents").mkdir(parents=True)
    (root / version / "documents" / "documents.db").write_bytes(b"")
    for name, data in index.items():
        (root / version / name).write_bytes(data)
    write_manifest(root / version, Manifest(
        version=version, content_hash="0" * 64, documents=1, embedder=TINY_EMBEDDER, index={}, shards=len(index),
        index_files=list(index), index_sha256={name: hashlib.sha256(data).hexdigest() for name, data in index.items()},
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(), kind="support"))
    return root / version
