"""./run.sh local's topology: workers, index shards and replicas laid out as settings the nodes accept."""
from __future__ import annotations

import pytest

from pipeline.config import Settings
from tools.local import LocalCluster, local_topology, main


@pytest.mark.parametrize("workers,shards,replicas,index_nodes,total", [
    (2, 1, 1, (2,), 3),           # today's three nodes
    (3, 2, 1, (3, 4), 5),
    (3, 2, 2, (3, 4, 5, 6), 7),   # two replicas of each shard: 3, 5 serve shard 0; 4, 6 shard 1
    (1, 1, 1, (1, 2), 3),         # one worker (node 0): the third node is a second replica of the index
])
def test_the_layout_is_workers_first_then_the_index_nodes(workers, shards, replicas, index_nodes, total, tmp_path):
    env = local_topology(workers, shards, replicas)
    cluster = LocalCluster(env, tmp_path).settings.cluster
    assert cluster.total_nodes == total and cluster.index_nodes == index_nodes
    assert cluster.workers == tuple(range(workers))
    assert {cluster.served_shard(n) for n in cluster.index_nodes} == set(range(shards))
    assert LocalCluster(env, tmp_path).start_order[-1] == 0  # node 0 starts last, the index first


def test_a_layout_needs_one_of_each_and_the_launcher_refuses_less(capsys):
    with pytest.raises(ValueError):
        local_topology(0, 1, 1)
    with pytest.raises(SystemExit) as exit_:
        main(["--workers", "0"])
    assert exit_.value.code == 2 and "--workers must be 1 or more" in capsys.readouterr().err


def test_settings_of_a_layout_parse_with_no_other_variable():
    assert Settings.from_env(local_topology(4, 3, 1)).cluster.replicas(2) == (6,)


def test_the_launcher_builds_missing_standins_before_any_node_starts(model_source, tmp_path, monkeypatch):
    # A node never builds models; the tool that starts the nodes does, once, then pins the source.
    import shutil

    from builders.standins import build as standins_build
    from tools.local import pinned_env
    built = []

    def build(profile, home, **kwargs):  # the real build, already made once: copied
        built.append((profile, home))
        shutil.copytree(model_source.cache_dir.parent, home)
        return home

    monkeypatch.setattr(standins_build, "build_standins", build)
    home = tmp_path / "standins"
    env = pinned_env({"MODEL_SOURCE": "standin", "STANDIN_PROFILE": "tiny", "STANDIN_HOME": str(home)}, cores=2)
    assert built == [("tiny", home)]
    assert env["MODEL_SOURCE"] == "standin" and env["STANDIN_HOME"] == str(home)
    assert pinned_env(env, cores=2)["STANDIN_HOME"] == str(home) and len(built) == 1  # built: found, not rebuilt


def test_the_launcher_builds_nothing_for_real_models_it_cannot_find(monkeypatch):
    from builders.standins import build as standins_build
    from pipeline.models import ModelsMissing, missing_models
    from tools.local import pinned_env
    if not missing_models():
        pytest.skip("the real models are in this machine's Hugging Face cache")
    monkeypatch.setattr(standins_build, "build_standins", lambda *a, **k: pytest.fail("built stand-ins for hub"))
    with pytest.raises(ModelsMissing):
        pinned_env({"MODEL_SOURCE": "hub", "HF_HUB_OFFLINE": "1"}, cores=2)
