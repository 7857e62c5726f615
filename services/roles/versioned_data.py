"""A node's data versions on disk and in memory: the one its settings point at, loaded at startup,
and any other in the same data root, loaded, switched to and released on a rollout's orders
(tools/data_rollout.py through services.roles.data_routes)."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from pipeline.data_version import (
    DataVersionError,
    Manifest,
    check_version_name,
    data_root_of,
    load_version,
    manifest_path,
    repoint_link,
    version_dir_of,
)
from services.roles.versions import Lease, VersionSet, VersionUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
# Opens what a node serves of one version: (version directory, its manifest) -> the value held.
Opener = Callable[[Path, Manifest], T]


class VersionedData(Generic[T]):
    """`configured`: FAISS_INDEX_PATH or DOCUMENTS_DIR (its parent is the startup version's directory,
    possibly a ``current`` link; versions lie beside it)."""

    def __init__(self, configured: Path, open_version: Opener[T], close: Callable[[T], None]):
        self.configured = Path(configured)
        self._open = open_version
        self.versions: VersionSet[T] = VersionSet(close)
        self.manifests: dict[str, Manifest] = {}
        self._loading = threading.Lock()

    def load_startup(self) -> Manifest:
        # Resolved once: a link repointed meanwhile cannot mix two versions' files.
        directory = version_dir_of(self.configured).resolve()
        return self._load(directory, current=True)

    def load(self, version: str) -> Manifest:
        """Hold `version` (from ``<data root>/<version>``) beside the others; a no-op if held."""
        check_version_name(version)
        if self.versions.has(version):
            return self.manifests[version]
        return self._load(data_root_of(self.configured) / version)

    def can_load(self, version: str) -> bool:
        """A complete build of `version` lies in the data root (a search naming it can load it)."""
        try:
            return manifest_path(data_root_of(self.configured) / check_version_name(version)).is_file()
        except ValueError:
            return False

    def _load(self, directory: Path, current: bool = False) -> Manifest:
        with self._loading:
            manifest = load_version(directory)
            if self.versions.has(manifest.version):
                return self.manifests[manifest.version]
            value = self._open(directory, manifest)
            self.manifests[manifest.version] = manifest
            self.versions.add(manifest.version, value, current=current)
        log.info("data version %s loaded from %s (%d documents, content %s)", manifest.version, directory,
                 manifest.documents, manifest.content_hash[:12])
        return manifest

    def switch(self, version: str) -> None:
        """New requests use `version`; the link the settings go through (if any) follows, so a restart
        comes back on it."""
        self.versions.switch(version)
        if repoint_link(self.configured, version):
            log.info("data version %s is current; %s points at it", version, version_dir_of(self.configured))
        else:
            log.info("data version %s is current", version)

    def release(self, version: str, timeout_s: float) -> bool:
        released = self.versions.release(version, timeout_s)
        if released:
            self.manifests.pop(version, None)
            log.info("data version %s released", version)
        return released

    def acquire(self, version: str | None = None, *, load_missing: bool = False) -> Lease[T]:
        """A request's hold on `version` (None: the current one). `load_missing`: a version not held
        but complete on disk is loaded first (a node restarted during a rollout catches up)."""
        try:
            return self.versions.acquire(version)
        except VersionUnavailable:
            if not (load_missing and version is not None and self.can_load(version)):
                raise
        try:
            self.load(version)
        except DataVersionError as exc:
            raise VersionUnavailable(f"data version {version!r} cannot be loaded here: {exc}") from None
        return self.versions.acquire(version)

    @property
    def current(self) -> str | None:
        return self.versions.current

    def status(self) -> dict:
        status = self.versions.status()
        for entry in status["loaded"]:
            manifest = self.manifests.get(entry["version"])
            if manifest is not None:
                entry.update(content_hash=manifest.content_hash, documents=manifest.documents,
                             parent=manifest.parent)
        return status

    def close(self) -> None:
        self.versions.close()
