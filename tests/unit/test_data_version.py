"""Data versions: the manifest a build writes, the embedder check, an incremental build from a
version, and a node's set of versions (one current, each released once its requests end)."""
from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

from builders.build_files import OutputExistsError
from builders.data import build_course, build_support
from builders.incremental import Changes, InvalidChanges, update_version
from builders.manifest import InvalidVersion
from pipeline.data_version import (
    RANDOM_VECTORS,
    DataVersionError,
    EmbedderInfo,
    content_hash,
    data_root_of,
    embedder_mismatch,
    load_version,
    repoint_link,
)
from pipeline.docstore import Document, DocumentStore
from pipeline.shards import document_shard
from pipeline.vector_index import ShardedVectorIndex
from services.roles.versioned_data import VersionedData
from services.roles.versions import VersionSet, VersionUnavailable
from services.server.errors import ApiError
from tests.helpers import blocked_in, wait_until
from tests.unit.test_data import FAKE_DIM, fake_embed

FAKE = EmbedderInfo(model="fake/bag-of-words", source="test", revision="r1", precision="float32", dim=FAKE_DIM)


@pytest.fixture(scope="module")
def v1(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    build_support(root / "v1", 240, fake_embed, embedder=FAKE, progress=False, shards=2, seed=3)
    return root / "v1"


def test_a_build_writes_its_manifest_last_naming_everything(v1):
    manifest = load_version(v1)
    assert manifest.version == "v1" and manifest.kind == "support" and manifest.documents == 240
    assert manifest.embedder == FAKE
    assert manifest.shards == 2 and manifest.index_files == ["faiss_index.shard-0-of-2.bin", "faiss_index.shard-1-of-2.bin"]
    assert manifest.index["type"] == "IndexIVFFlat" and manifest.index["dim"] == FAKE_DIM
    assert manifest.content_hash == content_hash(v1 / "documents" / "documents.db")
    assert manifest.parent is None


def test_a_course_build_is_random_vectors_any_embedder_of_its_dimension_may_search(tmp_path):
    manifest = build_course(tmp_path / "c", 100, progress=False).manifest
    assert manifest is not None and manifest.embedder.model == RANDOM_VECTORS
    ours = EmbedderInfo("BAAI/bge-base-en-v1.5", "hub", "abc", "bfloat16", 768)
    assert embedder_mismatch(manifest.embedder, ours) == []
    assert embedder_mismatch(manifest.embedder, dataclasses.replace(ours, dim=384)) == ["dimension 768 vs 384"]


def test_embedder_mismatch_names_model_weights_and_revision_but_not_precision():
    built = EmbedderInfo("BAAI/bge-base-en-v1.5", "standin:tiny", "f1c8", "float32", 768)
    assert embedder_mismatch(built, dataclasses.replace(built, precision="int8-dynamic")) == []
    assert embedder_mismatch(built, dataclasses.replace(built, source="hub")) == ["weights from standin:tiny vs hub"]
    assert embedder_mismatch(built, dataclasses.replace(built, revision="beef")) == ["revision f1c8 vs beef"]
    assert embedder_mismatch(built, dataclasses.replace(built, model="x/y")) == ["model BAAI/bge-base-en-v1.5 vs x/y"]


def test_a_directory_without_its_manifest_or_under_another_name_is_no_version(v1, tmp_path):
    with pytest.raises(DataVersionError, match="holds no manifest.json"):
        load_version(tmp_path)
    copy = Path(shutil.copytree(v1, tmp_path / "v9"))  # a copy under another name: its manifest says v1
    with pytest.raises(DataVersionError, match="holds version 'v1' by its manifest but is named 'v9'"):
        load_version(copy)


def test_the_version_id_is_the_directory_name(tmp_path):
    with pytest.raises(InvalidVersion):
        build_course(tmp_path / ".hidden", 50, progress=False)
    with pytest.raises(InvalidVersion):
        build_course(tmp_path / "current", 50, progress=False)


def test_versions_lie_beside_each_other_and_a_current_link_follows_a_switch(v1, tmp_path):
    root = v1.parent
    link = root / "current"
    link.unlink(missing_ok=True)
    os.symlink("v1", link)
    configured = link / "faiss_index.bin"
    assert data_root_of(configured) == root.resolve()
    assert repoint_link(configured, "v2") and os.readlink(link) == "v2"
    assert not repoint_link(v1 / "faiss_index.bin", "v2")  # no link: nothing to repoint
    link.unlink()


def test_a_link_on_a_read_only_volume_stays_and_repointing_it_says_so(v1, monkeypatch):
    """The serving containers of compose and Kubernetes mount the data read-only: every write there
    fails with EROFS, removing a file that is not there included. The link stays; the caller is told."""
    link = v1.parent / "current"
    link.unlink(missing_ok=True)
    os.symlink("v1", link)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")
    with monkeypatch.context() as patched:
        for name in ("symlink", "replace", "unlink"):
            patched.setattr(os, name, read_only)
        assert repoint_link(link / "faiss_index.bin", "v2") is False
    assert os.readlink(link) == "v1"
    link.unlink()


# ---------------------------------------------------------------- incremental builds


def rows(db: Path) -> dict[int, tuple]:
    with sqlite3.connect(db) as conn:
        return {row[0]: row for row in conn.execute("SELECT * FROM documents")}


def test_an_incremental_build_adds_replaces_and_deletes_without_embedding_the_rest(v1):
    embedded: list[str] = []

    def counting(texts):
        embedded.extend(texts)
        return fake_embed(texts)

    changes = Changes(upserts=(Document(7, "Lockers", "Parcel lockers hold deliveries for three days.", "shipping"),
                               Document(5001, "Gift cards", "Gift cards are redeemed at checkout online.", "billing")),
                      deletes=(10, 11))
    result = update_version(v1, v1.parent / "v2", changes, counting, FAKE)
    assert embedded == [doc.content for doc in changes.upserts]  # nothing else embedded again
    manifest = result.manifest
    assert (manifest.version, manifest.parent, manifest.documents) == ("v2", "v1", 239)
    assert manifest.changes == {"added": 1, "replaced": 1, "deleted": 2}
    old, new = rows(v1 / "documents" / "documents.db"), rows(v1.parent / "v2" / "documents" / "documents.db")
    assert set(new) == (set(old) - {10, 11}) | {5001}
    assert new[7] == changes.upserts[0].as_row() and new[5001] == changes.upserts[1].as_row()
    assert all(new[i] == old[i] for i in new if i not in (7, 5001))
    index = ShardedVectorIndex.load([v1.parent / "v2" / name for name in manifest.index_files], nprobe=64)
    for shard in index.shards:  # each id in its own shard, every document indexed once
        stored = shard.search(fake_embed(["x"]), 1000)[0][0]
        stored = stored[stored >= 0]
        assert len({document_shard(int(i), 2) for i in stored}) == 1
    ids, distances = index.search(fake_embed([doc.content for doc in changes.upserts]), 1)
    assert ids[:, 0].tolist() == [7, 5001] and np.allclose(distances[:, 0], 0, atol=1e-5)
    everything = np.concatenate([s.search(fake_embed(["x"]), 1000)[0][0] for s in index.shards])
    assert sorted(int(i) for i in everything if i >= 0) == sorted(new)


def test_an_incremental_build_refuses_another_embedder_and_unknown_deletes(v1, tmp_path):
    other = dataclasses.replace(FAKE, model="other/model")
    with pytest.raises(Exception, match="built by fake/bag-of-words"):
        update_version(v1, tmp_path / "v3", Changes((), (1,)), fake_embed, other)
    with pytest.raises(InvalidChanges, match="not in version 'v1'"):
        update_version(v1, tmp_path / "v3", Changes((), (999_999,)), fake_embed, FAKE)
    update_version(v1, tmp_path / "v3", Changes((), (1,)), fake_embed, FAKE)
    with pytest.raises(OutputExistsError):
        update_version(v1, tmp_path / "v3", Changes((), (2,)), fake_embed, FAKE)


def test_a_changes_file_names_the_line_and_the_rule(tmp_path):
    path = tmp_path / "changes.jsonl"
    path.write_text('{"doc_id": 1, "delete": true}\n{"doc_id": 1, "title": "t", "content": "c", "category": "g"}\n')
    with pytest.raises(InvalidChanges, match="line 2: doc_id 1 is changed twice"):
        Changes.read(path)
    path.write_text('{"doc_id": 2, "title": "t", "content": ""}\n')
    with pytest.raises(InvalidChanges, match="line 1: a document needs non-empty strings"):
        Changes.read(path)
    path.write_text('{"doc_id": 2, "title": "t", "content": "c", "category": "g"}\n\n{"doc_id": 3, "delete": true}\n')
    changes = Changes.read(path)
    assert changes.deletes == (3,) and [d.doc_id for d in changes.upserts] == [2]


# ---------------------------------------------------------------- a node's versions


def test_a_version_is_released_only_once_its_requests_end_and_never_while_current():
    closed: list[str] = []
    versions: VersionSet[str] = VersionSet(closed.append)
    versions.add("v1", "store-1")
    lease = versions.acquire()
    assert (lease.version, lease.value) == ("v1", "store-1")
    versions.add("v2", "store-2")
    assert versions.current == "v1"  # loaded beside it, not switched to
    versions.switch("v2")
    assert versions.acquire().version == "v2"
    with pytest.raises(ApiError) as refused:
        versions.release("v2", 0)
    assert refused.value.status == 409
    assert versions.release("v1", 0) is False and closed == []  # its request is still in flight
    with pytest.raises(VersionUnavailable):
        versions.acquire("v1")  # no new request takes it while it is being released
    done = threading.Event()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: (result.append(versions.release("v1", 30)), done.set()))
    waiter.start()
    wait_until(lambda: blocked_in(waiter, "release"), 10, "release() never waited for the request in flight")
    assert not done.is_set()
    lease.release()
    waiter.join(10)
    assert result == [True] and closed == ["store-1"]
    assert versions.release("v1", 0) is True  # released already: nothing to do
    assert [entry["version"] for entry in versions.status()["loaded"]] == ["v2"]


def test_a_node_loads_a_version_from_beside_its_own_and_catches_up_on_a_named_one(v1):
    update_version(v1, v1.parent / "v5", Changes((), (20,)), fake_embed, FAKE)
    opened: list[str] = []

    def open_version(directory: Path, manifest) -> DocumentStore:
        opened.append(manifest.version)
        return DocumentStore(directory / "documents")

    data = VersionedData(v1 / "documents", open_version, DocumentStore.close)
    assert data.load_startup().version == "v1" and data.current == "v1"
    lease = data.acquire("v5", load_missing=True)  # named by a request, complete on disk: loaded
    try:
        assert lease.version == "v5" and lease.value.fetch([20]) == [] and lease.value.fetch([21])
    finally:
        lease.release()
    assert opened == ["v1", "v5"] and data.current == "v1"
    with pytest.raises(VersionUnavailable):
        data.acquire("v7", load_missing=True)
    data.switch("v5")
    assert data.release("v1", 1) and data.current == "v5"
    data.close()


def test_a_worker_refuses_to_load_a_version_built_by_another_embedder_naming_both(v1):
    from pipeline.config import Settings
    from services.roles.worker.role import versioned_documents
    update_version(v1, v1.parent / "v6", Changes((), (30,)), fake_embed, FAKE)
    settings = Settings.from_env({"DOCUMENTS_DIR": str(v1 / "documents")})
    ours = dataclasses.replace(FAKE, source="hub")
    data = versioned_documents(settings, ours)
    with pytest.raises(DataVersionError) as refused:
        data.load_startup()
    assert "'v1'" in str(refused.value) and FAKE.describe() in str(refused.value) and ours.describe() in str(refused.value)
    data = versioned_documents(settings, FAKE)
    assert data.load_startup().version == "v1"
    assert data.load("v6").parent == "v1"
    data.close()


def test_the_openai_rag_field_names_the_data_version_that_answered():
    from services.roles.gateway.openai_responses import rag_fields
    from services.server.answer import FinalAnswer
    reply = {"request_id": "r", "generated_response": "a", "sentiment": "neutral", "is_toxic": "false",
             "data_version": "v2", "sources": [4, 1]}
    assert rag_fields(FinalAnswer.from_wire(reply)) == {"sentiment": "neutral", "is_toxic": "false", "request_id": "r",
                                                        "data_version": "v2"}
    assert "data_version" not in rag_fields(FinalAnswer.from_wire({k: v for k, v in reply.items() if k != "data_version"}))
