"""profiling.service_protocol end to end: a real cluster of node processes on 127.0.0.1 per configuration (tiny
stand-ins, a small course build), every request answered, each figure beside this machine's floor."""
from __future__ import annotations

import json
import os

import pytest

from profiling import service_protocol as tool
from tests.helpers import TEST_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def standins_env(model_source, monkeypatch):
    for name, value in TEST_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("STANDIN_HOME", str(model_source.cache_dir.parent))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_each_layout_serves_every_request_and_is_set_beside_its_floor(tmp_path, course_data, standins_env, capsys):
    data = course_data.index_path.parent
    assert tool.main(["--data", str(data), "--precisions", "float32", "--layouts", "1x1,2x1", "--idle-count", "2",
                      "--concurrency", "2", "--count", "4", "--matmul-size", "64", "--bandwidth-mib", "8",
                      "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "service_protocol.json").read_text())
    assert [(r["precision"], r["layout"]) for r in report["results"]] == [("float32", "1x1"), ("float32", "2x1")]
    for result in report["results"]:
        idle, loaded = result["idle"], result["loaded"]
        assert idle["sent"] == idle["ok"] == 2 and loaded["sent"] == loaded["ok"] == 4
        assert 0 < idle["p50_s"] <= idle["p95_s"] and loaded["requests_per_minute"] > 0
        served = set(loaded["served_by"])  # the gateway round-robins over the layout's workers, none other
        assert served == ({"0"} if result["layout"] == "1x1" else {"0", "1"})
    # The floor is counted over the build's documents (a course row is a sentence), on this machine's peaks.
    assert report["counted"]["documents"] == str(data / "documents")
    assert set(report["machines"]) == {"1", str(min(2, os.cpu_count() or 1))}
    floors = report["floors"]["float32"]
    # One request alone runs on one worker's thread in both layouts: the same floor, from the one-thread peaks.
    assert floors["1x1"]["idle_s"] == floors["2x1"]["idle_s"] > 0
    assert floors["1x1"]["concurrent_rpm"] > 0 and floors["2x1"]["concurrent_rpm"] > 0
    out = capsys.readouterr().out
    first = report["results"][0]
    assert f"{first['idle']['p50_s'] / floors['1x1']['idle_s']:.2f}" in out


@pytest.mark.parametrize("argv, says", [
    (["--layouts", "2y1"], "WORKERSxTHREADS"),
    (["--layouts", "0x1"], "WORKERSxTHREADS"),
])
def test_a_bad_layout_is_refused_before_anything_starts(tmp_path, argv, says, capsys):
    with pytest.raises(SystemExit) as refused:
        tool.main(["--data", str(tmp_path), *argv, "--out", str(tmp_path / "out")])
    assert refused.value.code == 2 and "layouts" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_data_folder_without_an_index_is_refused_naming_it(tmp_path, standins_env, capsys):
    assert tool.main(["--data", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "FAISS_INDEX_PATH" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
