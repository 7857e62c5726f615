"""A data version's directory as the nodes and tools recognise it, without a build: its manifest alone
(pipeline.data_version.load_version reads nothing else), for tests of what lays versions out and links them."""
from __future__ import annotations

import datetime
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
