"""profiling.bench_sharded_search on a small course index: real index nodes on 127.0.0.1, the
sharded and unsharded searches timed side by side and found to return the same ids."""
from __future__ import annotations

import json

import pytest

from profiling import bench_sharded_search

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_two_shards_against_one_index_same_ids_and_figures_for_each_batch_size(tmp_path, capsys):
    from builders.data import build_course
    whole = build_course(tmp_path / "whole", 3000, seed=0, progress=False)
    sharded = build_course(tmp_path / "sharded", 3000, seed=0, progress=False, shards=2)
    out = tmp_path / "out"
    code = bench_sharded_search.main(["--index", str(whole.index_path), "--sharded-index", str(sharded.index_path),
                                      "--shards", "2", "--batch", "1,4", "--rounds", "3", "--out", str(out)])
    assert code == 0, capsys.readouterr()
    report = json.loads((out / "bench_sharded_search.json").read_text())
    assert set(report["by_batch"]) == {"1", "4"}
    for row in report["by_batch"].values():
        assert row["same_ids"] is True and row["unsharded_ms"] > 0 and row["sharded_ms"] > 0
    assert "sharded/unsharded time" in capsys.readouterr().out


def test_missing_shard_files_are_refused_naming_them(tmp_path, capsys):
    code = bench_sharded_search.main(["--index", str(tmp_path / "a.bin"), "--sharded-index", str(tmp_path / "b.bin"),
                                      "--shards", "2"])
    assert code == 2 and "b.shard-0-of-2.bin" in capsys.readouterr().err
