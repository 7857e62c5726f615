"""The files of a data build, written crash-safely: ``DIR/documents/documents.db``, the index file(s) and
the recall check's queries (``recall_queries.npz``: builders.recall_queries); its manifest
(builders.manifest) comes after them.

Crash safety. Every file is written under a temporary name next to its final
place (``documents/.documents.db.partial``, ``.faiss_index.bin.partial``, one per
shard), fsynced, then renamed: database first, index files last, so they exist
only after a complete build. An existing manifest is removed before the first rename and the new
one written after the last, so a build killed at any point (SIGKILL runs no cleanup) leaves either
the previous version whole, with its manifest, or a directory without one, which no node serves. Any failure removes the partial files; a failure
between the renames removes every final file, so a new database never sits
beside a stale index. Existing outputs (and index files of another shard count,
which the build then removes) are only replaced with ``force``; until the final
renames, the previous build stays intact.
"""
from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from itertools import islice
from pathlib import Path

from tqdm import tqdm

from pipeline.data_version import manifest_path, remove_manifest
from pipeline.shards import shard_files_beside, shard_path
from pipeline.spec import DOCUMENTS_COLUMNS, DOCUMENTS_DB, DOCUMENTS_SCHEMA, DOCUMENTS_TABLE

DOCS_SUBDIR = "documents"
INDEX_FILENAME = "faiss_index.bin"
QUERIES_FILENAME = "recall_queries.npz"
PARTIAL_SUFFIX = ".partial"
INSERT = (f"INSERT INTO {DOCUMENTS_TABLE} ({', '.join(DOCUMENTS_COLUMNS)}) "
          f"VALUES ({', '.join('?' * len(DOCUMENTS_COLUMNS))})")


class BuildError(Exception):
    """A build that cannot start; the CLI reports it in one line with exit code 2."""


class OutputExistsError(BuildError, FileExistsError):
    pass


def output_paths(out_dir: str | Path) -> tuple[Path, Path]:
    """``(db_path, index_path)`` of a build in ``out_dir``."""
    out_dir = Path(out_dir)
    return out_dir / DOCS_SUBDIR / DOCUMENTS_DB, out_dir / INDEX_FILENAME


def index_files(index_path: str | Path, shards: int) -> list[Path]:
    """The index files of a build into ``index_path`` with ``shards`` shards."""
    return [shard_path(index_path, shard, shards) for shard in range(shards)]


def stale_index_files(index_path: str | Path, shards: int) -> list[Path]:
    """Index files of another shard count beside ``index_path``: a ``shards``-shard build removes them."""
    others = [path for _, count, path in shard_files_beside(index_path) if count != shards]
    if shards > 1 and Path(index_path).exists():
        others.append(Path(index_path))
    return sorted(others)


def check_outputs(out_dir: str | Path, force: bool, shards: int = 1) -> None:
    """Raise :class:`OutputExistsError` if a build would overwrite or remove a version's files without
    ``force``; files beside no manifest are what an interrupted build left, replaced without asking."""
    if not manifest_path(out_dir).is_file():
        return
    db_path, index_path = output_paths(out_dir)
    existing = [p for p in (db_path, *index_files(index_path, shards)) if p.exists()]
    existing += stale_index_files(index_path, shards)
    if existing and not force:
        names = ", ".join(str(p) for p in existing)
        raise OutputExistsError(f"refusing to overwrite existing {names} (use --force)")


def _partial(path: Path) -> Path:
    return path.with_name(f".{path.name}{PARTIAL_SUFFIX}")


def staged_queries(out_dir: str | Path) -> Path:
    """Where a build in :func:`staged_outputs` writes its recall queries (builders.recall.measure_build's
    ``keep``): renamed into place with the index files."""
    return _partial(Path(out_dir) / QUERIES_FILENAME)


@contextmanager
def staged_outputs(out_dir: str | Path, force: bool, shards: int = 1) -> Iterator[tuple[Path, list[Path]]]:
    """Yield temporary paths for (db, [index files]); rename them into place on success (with the recall
    queries, if :func:`staged_queries` was written), then remove the index files of another shard count."""
    check_outputs(out_dir, force, shards)
    db_path, index_path = output_paths(out_dir)
    finals = [db_path, *index_files(index_path, shards), Path(out_dir) / QUERIES_FILENAME]
    created_dir = not db_path.parent.exists()
    db_path.parent.mkdir(parents=True, exist_ok=True)
    temps = [_partial(path) for path in finals]
    _remove(temps)  # leftovers of a build that was killed
    try:
        yield temps[0], temps[1:-1]
        # The directory stops being a version before any of its files is replaced; the caller writes
        # the new manifest last (builders.manifest), so a build killed anywhere leaves none.
        remove_manifest(out_dir)
        _commit(temps, finals)
    except BaseException:
        _remove(temps)
        if created_dir:
            with suppress(OSError):  # kept if something else was put in it
                db_path.parent.rmdir()
        raise
    # Only now: a failed build keeps the previous one whole. Served beside the new files, they
    # would be a startup error (pipeline.shards.shard_file_problems).
    _remove(stale_index_files(index_path, shards))


def _commit(temps: list[Path], finals: list[Path]) -> None:
    try:
        for temp, final in zip(temps, finals):  # database first, index files and recall queries last
            if final.name == QUERIES_FILENAME and not temp.exists():
                final.unlink(missing_ok=True)  # an earlier build's: its queries' answers are not this index's
            else:
                os.replace(temp, final)
    except BaseException:
        _remove(finals)  # never leave a new database beside a stale index
        raise
    for folder in {path.parent for path in finals}:
        with suppress(OSError):  # makes the renames durable; not every platform can fsync a directory
            fsync_path(folder)


def _remove(paths: Iterable[Path]) -> None:
    for path in paths:
        for extra in ("", "-journal", "-wal", "-shm"):  # SQLite side files, if any
            Path(f"{path}{extra}").unlink(missing_ok=True)


def fsync_path(path: Path) -> None:
    """Flush a file's (or a folder's entries') writes to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def db_writer(path: Path) -> Iterator[Callable[[list[tuple]], None]]:
    """Yield ``insert(rows)``; all inserts share one transaction, committed on exit."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        # No journal or syncs: a failed build deletes this file anyway.
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute(DOCUMENTS_SCHEMA)
        conn.execute("BEGIN")
        yield lambda rows: conn.executemany(INSERT, rows)
        conn.execute("COMMIT")
    finally:
        conn.close()
    fsync_path(path)


def chunks(items: Iterable, size: int, total: int, desc: str, progress: bool) -> Iterator[list]:
    """Lists of up to ``size`` items, with a progress bar counting items."""
    it = iter(items)
    with tqdm(total=total, desc=desc, unit="doc", unit_scale=True, disable=not progress) as bar:
        while chunk := list(islice(it, size)):
            yield chunk
            bar.update(len(chunk))
