"""A built version split in centroid shards (builders.centroid_shards), its manifest, the router read
back from it, and an index node's rules for a body's "lists" (services.roles.index.probe_lists)."""
from __future__ import annotations

import json
import shutil

import faiss
import numpy as np
import pytest

from builders import data
from builders.build_files import BuildError
from builders.centroid_shards import CentroidShardError, split_version
from builders.recall import RecallOptions
from pipeline.centroid_routing import CentroidRouter, quantizer_path
from pipeline.centroid_search import CentroidShardedIndex, owned_lists
from pipeline.data_version import read_manifest
from pipeline.shards import shard_file_problems, shard_path
from services.roles.index.probe_lists import owned_lists_of, parse_probe_lists
from services.server.errors import ApiError

# Uniform course vectors are under the recall floor at a small nprobe; what is tested here is
# equality with the unsharded index at the same nprobe, not recall.
LOW_RECALL_ACCEPTED = RecallOptions(accept_low=True)

DOCS, DIM, NLIST, NPROBE = 3000, 32, 48, 6


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One course build, kept unsharded (`whole`), and split in 3 centroid shards (`v1`)."""
    root = tmp_path_factory.mktemp("centroid")
    result = data.build_course(root / "v1", DOCS, nlist=NLIST, nprobe=NPROBE, dim=DIM, progress=False, batch_size=1000,
                             recall=LOW_RECALL_ACCEPTED)
    whole = root / "whole.bin"
    shutil.copy(result.index_path, whole)
    split_version(root / "v1", 3, "bisect")
    return root / "v1", result.index_path, whole


def test_the_version_holds_the_shards_the_quantizer_and_the_owners(built):
    version_dir, index_path, whole = built
    manifest = read_manifest(version_dir)
    assert manifest.shards == 3 and manifest.sharding["kind"] == "centroid" and manifest.sharding["shards"] == 3
    assert manifest.index_files == [shard_path(index_path, s, 3).name for s in range(3)] + ["faiss_index.quantizer.bin"]
    assert set(manifest.index_sha256) == set(manifest.index_files) and not index_path.exists()
    assert shard_file_problems(index_path, 3) == []
    owners = np.array(manifest.sharding["owners"])
    unsharded = faiss.read_index(str(whole))
    total = 0
    for shard in range(3):
        index = faiss.read_index(str(shard_path(index_path, shard, 3)))
        assert index.nlist == NLIST and index.nprobe == NPROBE
        for lst in range(NLIST):
            size = index.invlists.list_size(lst)
            assert size == (unsharded.invlists.list_size(lst) if owners[lst] == shard else 0)
            if size:  # the same entries, in the same order
                ids = faiss.rev_swig_ptr(index.invlists.get_ids(lst), size)
                np.testing.assert_array_equal(ids, faiss.rev_swig_ptr(unsharded.invlists.get_ids(lst), size))
        total += index.ntotal
    assert total == DOCS


def test_the_router_read_back_gives_the_unsharded_top_10(built):
    version_dir, index_path, whole = built
    manifest = read_manifest(version_dir)
    router = CentroidRouter.load(version_dir, index_path.name, manifest.sharding, NPROBE)
    assert router.nlist == NLIST and router.dim == DIM and router.nprobe == NPROBE
    shards = [faiss.read_index(str(shard_path(index_path, s, 3))) for s in range(3)]
    queries = np.random.default_rng(5).random((64, DIM), dtype=np.float32)
    expected_distances, expected_ids = faiss.read_index(str(whole)).search(queries, 10)
    ids, distances = CentroidShardedIndex(router, shards).search(queries, 10)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_array_equal(distances, expected_distances)


def test_a_sharded_version_is_not_split_again(built):
    with pytest.raises(CentroidShardError, match="already in 3 shards"):
        split_version(built[0], 2)


def test_more_shards_than_lists_are_refused_and_the_version_kept(tmp_path):
    result = data.build_course(tmp_path / "v2", 200, nlist=4, dim=8, progress=False, recall=LOW_RECALL_ACCEPTED)
    with pytest.raises(CentroidShardError, match=r"between 2 and nlist \(4\)"):
        split_version(tmp_path / "v2", 5)
    assert read_manifest(tmp_path / "v2").shards == 1 and result.index_path.is_file()


def test_the_cli_builds_centroid_shards_and_refuses_one_shard(tmp_path, capsys):
    assert data.main(["build", "--out", str(tmp_path / "v3"), "--docs", "400", "--nlist", "8", "--shards", "2",
                      "--sharding", "centroid", "--balance", "greedy", "--no-progress"]) == 0
    manifest = json.loads((tmp_path / "v3" / "manifest.json").read_text())
    assert manifest["shards"] == 2 and manifest["sharding"]["method"] == "greedy"
    assert quantizer_path(tmp_path / "v3" / "faiss_index.bin").is_file()
    assert "2 shards" in capsys.readouterr().out
    assert data.main(["build", "--out", str(tmp_path / "v4"), "--docs", "400", "--sharding", "centroid"]) == 2
    assert "--sharding centroid needs --shards 2 or more, got 1" in capsys.readouterr().err


def test_owned_lists_come_from_the_manifest(built):
    manifest = read_manifest(built[0])
    owned = [owned_lists_of(manifest, shard) for shard in range(3)]
    assert all(owned) and set().union(*owned) == set(range(NLIST)) and sum(map(len, owned)) == NLIST  # type: ignore[arg-type]
    assert owned[0] == owned_lists(manifest.sharding["owners"], 0)


OWNED = frozenset({1, 2, 5})


@pytest.mark.parametrize("body, message", [
    ({}, "'lists' is required: shard 0 is a centroid shard"),
    ({"lists": [[1]]}, r"one list of IVF list ids per embedding \(2\)"),
    ({"lists": "1,2"}, "one list of IVF list ids per embedding"),
    ({"lists": [[1], []]}, r"lists\[1\] must be a list of 1 to 8 IVF list ids"),
    ({"lists": [[1], [8]]}, r"lists\[1\] holds 8: IVF list ids are integers from 0 to 7"),
    ({"lists": [[-1], [1]]}, r"lists\[0\] holds -1"),
    ({"lists": [[1.0], [1]]}, r"lists\[0\] holds 1.0"),
    ({"lists": [[True], [1]]}, r"lists\[0\] holds True"),
    ({"lists": [[1], [3]]}, r"lists\[1\] names list 3, which shard 0 does not own"),
    ({"lists": [[1, 1], [2]]}, r"lists\[0\] names a list twice"),
])
def test_bad_lists_are_a_400_naming_the_field_and_rule(body, message):
    with pytest.raises(ApiError, match=message) as caught:
        parse_probe_lists(body, 2, 8, OWNED, "shard 0")
    assert caught.value.status == 400 and caught.value.field == "lists"


def test_a_hash_shard_refuses_lists_and_a_centroid_shard_takes_its_own():
    with pytest.raises(ApiError, match="'lists' is for centroid shards; shard 0 holds documents by doc_id % N"):
        parse_probe_lists({"lists": [[1]]}, 1, 8, None, "shard 0")
    assert parse_probe_lists({}, 1, 8, None, "shard 0") is None
    assert parse_probe_lists({"lists": [[5, 1], [2]]}, 2, 8, OWNED, "shard 0") == [[5, 1], [2]]


def test_an_incremental_update_of_centroid_shards_is_refused(built, tmp_path):
    """An update writes doc_id % N shards: from a centroid version it would scatter documents."""
    from builders.incremental import Changes, update_version
    from builders.manifest import random_vectors
    with pytest.raises(BuildError, match="centroid shards; an update writes doc_id % N shards"):
        update_version(built[0], tmp_path / "v9", Changes(upserts=(), deletes=()), lambda texts: None,
                       random_vectors(DIM))
    assert not (tmp_path / "v9").exists()


def test_the_reference_searching_every_centroid_shard_gets_the_unsharded_top_10(built):
    # Each shard keeps the whole quantizer and probes the same nearest lists, of which only its own hold
    # entries: searched one by one and merged (pipeline.vector_index.ShardedVectorIndex, the reference's
    # way), the shards give the unsharded index's top 10; they are only all visited.
    from pipeline.vector_index import ShardedVectorIndex, VectorIndex
    _version_dir, index_path, whole = built
    queries = np.random.default_rng(3).standard_normal((300, DIM)).astype(np.float32)
    shards = ShardedVectorIndex.load([shard_path(index_path, s, 3) for s in range(3)], nprobe=NPROBE)
    expected_d, expected_i = VectorIndex.load(whole, nprobe=NPROBE).search(queries, 10)
    got_d, got_i = shards.search(queries, 10)
    np.testing.assert_array_equal(got_d, expected_d)
    np.testing.assert_array_equal(got_i, expected_i)


def test_verify_names_a_missing_or_changed_quantizer_file(built, tmp_path, capsys):
    from builders import manifest as build_manifest
    version_dir, index_path, _ = built
    assert build_manifest.main(["verify", str(version_dir)]) == 0
    copy = tmp_path / "v1"
    shutil.copytree(version_dir, copy)
    quantizer = quantizer_path(copy / index_path.name)
    data_bytes = quantizer.read_bytes()
    quantizer.write_bytes(data_bytes[:-1] + bytes([data_bytes[-1] ^ 0xFF]))  # one byte changed
    assert build_manifest.file_problems(copy, hashes=False) == []  # there, so only the hashes tell
    assert build_manifest.main(["verify", str(copy)]) == 1
    assert f"{quantizer} is not the file the build wrote" in capsys.readouterr().err
    quantizer.unlink()
    assert build_manifest.file_problems(copy, hashes=False) == [f"{quantizer} is missing"]
