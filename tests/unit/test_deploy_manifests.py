"""deploy/: every YAML parses; the Kubernetes objects validate against the real Kubernetes JSON
schemas (kubernetes-validate, offline, strict); compose.yaml against the Compose Specification
(compose-spec); the wiring agrees (settings are real, ports, names, selectors, probes, topology).

No container runtime or cluster is needed: these check the files, and wait-for-data.sh is run
as the image runs it.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from pipeline.config import REPO_ROOT, Settings
from pipeline.kernels.versions import TORCH_VERIFIED
from pipeline.shards import shard_path

kubernetes_validate = pytest.importorskip("kubernetes_validate")
compose_spec = pytest.importorskip("compose_spec")

DEPLOY = REPO_ROOT / "deploy"
K8S = DEPLOY / "k8s"
KUBERNETES_VERSION = "1.37"
IMAGE = "rag-service"
PORT = 8000
# The topology settings being added (docs/scaling.md); NODE_<n>_IP for n < TOTAL_NODES too.
NEW_TOPOLOGY_SETTINGS = {"INDEX_NODES", "INDEX_SHARDS", "BIND_HOST"}
NODE_ADDRESS = re.compile(r"NODE_(\d+)_IP")
# Per pod, or secret, so not in the shared ConfigMap; WORKER_NODES follows from INDEX_NODES.
NOT_IN_CONFIGMAP = {"NODE_NUMBER", "CLUSTER_TOKEN", "WORKER_NODES"}


def load_all(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_objects() -> list[dict]:
    return [obj for path in sorted(K8S.glob("*.yaml")) if path.name != "kustomization.yaml" for obj in load_all(path)]


def by_kind(kind: str) -> dict[str, dict]:
    return {obj["metadata"]["name"]: obj for obj in k8s_objects() if obj["kind"] == kind}


def interpolate(text: str) -> str:
    """What compose does to ${VAR:-default} with VAR unset."""
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", lambda m: m.group(2) or "", text)


def compose() -> dict:
    return yaml.safe_load(interpolate((DEPLOY / "compose.yaml").read_text()))


def node_services() -> dict[str, dict]:
    """The compose services that run a node (our image and a NODE_NUMBER)."""
    return {name: svc for name, svc in compose()["services"].items()
            if svc.get("image", "").startswith(IMAGE) and "NODE_NUMBER" in svc.get("environment", {})}


def settings_env(names, total_nodes: int) -> list[str]:
    """The names that are neither settings, the new topology settings, nor a NODE_<n>_IP with n < total_nodes."""
    known = set(Settings.variables()) | NEW_TOPOLOGY_SETTINGS
    unknown = []
    for name in names:
        match = NODE_ADDRESS.fullmatch(name)
        if name not in known and not (match and int(match[1]) < total_nodes):
            unknown.append(name)
    return unknown


def env_example() -> dict[str, str]:
    return dict(re.findall(r"^([A-Z][A-Z0-9_]*)=(.*)$", (REPO_ROOT / "env.example").read_text(), flags=re.M))


# ---------------------------------------------------------------- parsing and schemas


def test_every_yaml_file_parses():
    files = sorted({*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")})
    assert len(files) >= 10
    for path in files:
        assert load_all(path), path


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in K8S.glob("*.yaml")
                                                        if p.name != "kustomization.yaml")
    assert kustomization["namespace"] in by_kind("Namespace")
    assert [image["name"] for image in kustomization["images"]] == [IMAGE]


def test_kubernetes_objects_validate_against_the_schemas():
    objects = k8s_objects()
    kinds = {obj["kind"] for obj in objects}
    assert {"Deployment", "StatefulSet", "Service", "ConfigMap", "HorizontalPodAutoscaler", "Job",
            "PersistentVolumeClaim", "Namespace"} <= kinds
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("break_it", [
    lambda d: d["spec"].__setitem__("replicas", "two"),
    lambda d: d["spec"]["template"]["spec"]["containers"][0].__setitem__("readinesProbe", {}),
    lambda d: d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"].__setitem__("memory", [1]),
])
def test_the_schema_validator_rejects_a_broken_object(break_it):
    broken = copy.deepcopy(by_kind("Deployment")["rag-worker"])
    break_it(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def validate_compose(data: dict) -> None:
    # The compose-spec parser does not apply YAML merge keys itself; PyYAML already did, as compose does.
    compose_spec.PyCompose.from_json(json.dumps(data)).to_spec()


def test_compose_validates_against_the_compose_spec():
    validate_compose(compose())
    broken = compose()
    broken["services"]["node1"]["depends_on"]["node2"]["condition"] = "service_ready"
    with pytest.raises(ValueError, match="service_ready"):
        validate_compose(broken)
    broken = compose()
    broken["services"]["node0"]["helthcheck"] = {}
    with pytest.raises(ValueError, match="helthcheck"):
        validate_compose(broken)


def test_compose_paths_exist():
    data = compose()
    for svc in data["services"].values():
        if "build" in svc:
            context = (DEPLOY / svc["build"]["context"]).resolve()
            assert context == REPO_ROOT and (context / svc["build"]["dockerfile"]).is_file()
        for env_file in svc.get("env_file", []):
            assert (DEPLOY / env_file).resolve() == REPO_ROOT / "env.example"
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), source
            else:
                assert source in data["volumes"], source


# ---------------------------------------------------------------- settings


def test_compose_env_names_are_settings():
    services = node_services()
    assert len(services) == 5
    for name, svc in services.items():
        env = svc["environment"]
        assert settings_env(env, int(env["TOTAL_NODES"])) == [], name
    data = compose()["services"]["data"]["environment"]
    assert settings_env(data, 3) == []


def test_k8s_env_names_are_settings():
    config = by_kind("ConfigMap")["rag-settings"]["data"]
    total = int(config["TOTAL_NODES"])
    assert settings_env(config, total) == []
    for obj in k8s_objects():
        pod = obj.get("spec", {}).get("template", {}).get("spec")
        for container in (pod or {}).get("containers", []) + (pod or {}).get("initContainers", []):
            assert settings_env([e["name"] for e in container.get("env", [])], total) == [], obj["metadata"]["name"]
            refs = [ref["configMapRef"]["name"] for ref in container.get("envFrom", []) if "configMapRef" in ref]
            assert refs == ["rag-settings"], obj["metadata"]["name"]


def test_configmap_carries_env_example_at_its_defaults_except_the_wiring():
    config = by_kind("ConfigMap")["rag-settings"]["data"]
    defaults = env_example()
    missing = sorted(set(defaults) - set(config) - NOT_IN_CONFIGMAP)
    assert missing == [], f"add these env.example settings to deploy/k8s/configmap.yaml: {missing}"
    assert not NOT_IN_CONFIGMAP & set(config)
    wiring = set(re.findall(r"^  ([A-Z0-9_]+): .*# cluster wiring", (K8S / "configmap.yaml").read_text(), flags=re.M))
    assert {"TOTAL_NODES", "NODE_0_IP", "INDEX_NODES", "BIND_HOST", "FAISS_INDEX_PATH"} <= wiring
    for name, value in config.items():
        assert isinstance(value, str), name
        if name not in wiring:
            assert value == defaults[name], name


# ---------------------------------------------------------------- topology, ports, probes


def host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def test_compose_topology_and_ports_agree():
    services = node_services()
    env = next(iter(services.values()))["environment"]
    total = int(env["TOTAL_NODES"])
    assert sorted(int(svc["environment"]["NODE_NUMBER"]) for svc in services.values()) == list(range(total))
    for svc in services.values():
        assert {k: v for k, v in svc["environment"].items() if k != "NODE_NUMBER"} == \
            {k: v for k, v in env.items() if k != "NODE_NUMBER"}  # one topology for all
    for name, svc in services.items():
        node = int(svc["environment"]["NODE_NUMBER"])
        assert host_port(env[f"NODE_{node}_IP"]) == (name, PORT)
        assert f"127.0.0.1:{PORT}/ready" in " ".join(svc["healthcheck"]["test"])
        for published in svc.get("ports", []):
            assert published == f"127.0.0.1:{PORT}:{PORT}" and node == 0
    index_nodes = [int(n) for n in env["INDEX_NODES"].split(",")]
    assert 0 not in index_nodes and len(index_nodes) >= int(env["INDEX_SHARDS"])
    workers = [n for n in range(total) if n not in index_nodes]
    assert len(workers) == 3 and len(index_nodes) == 2
    built = compose()["services"]["data"]["command"][0]
    assert f"--shards {env['INDEX_SHARDS']}" in built
    assert shard_path(env["FAISS_INDEX_PATH"], int(env["INDEX_SHARDS"]) - 1, int(env["INDEX_SHARDS"])).name in built


def test_compose_prometheus_scrapes_every_node():
    config = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    rag = next(job for job in config["scrape_configs"] if job["job_name"] == "rag")
    targets = sorted(t for group in rag["static_configs"] for t in group["targets"])
    assert targets == sorted(f"{name}:{PORT}" for name in node_services())
    assert config["rule_files"] == ["rag-alerts.rules.yml"]


def test_compose_prometheus_config_passes_promtool(tmp_path):
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (deploy/install-test-tools.sh installs it)")
    shutil.copy(DEPLOY / "compose" / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copy(DEPLOY / "prometheus" / "rag-alerts.rules.yml", tmp_path / "rag-alerts.rules.yml")
    result = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def main_container(obj: dict) -> dict:
    (container,) = pod_spec(obj)["containers"]
    return container


def test_k8s_topology_names_resolve_to_services_and_pods():
    config = by_kind("ConfigMap")["rag-settings"]["data"]
    services, index = by_kind("Service"), by_kind("StatefulSet")["rag-index"]
    total, replicas = int(config["TOTAL_NODES"]), index["spec"]["replicas"]
    index_nodes = [int(n) for n in config["INDEX_NODES"].split(",")]
    # Nodes 0 (gateway) and 1 (the workers' Service), then one per index pod: ordinal + 2.
    assert index_nodes == [ordinal + 2 for ordinal in range(replicas)] and total == 2 + replicas
    assert len(index_nodes) % int(config["INDEX_SHARDS"]) == 0
    assert "$$((${HOSTNAME##*-} + 2))" in " ".join(main_container(index)["command"])
    assert host_port(config["NODE_0_IP"]) == ("rag-gateway", PORT)
    assert host_port(config["NODE_1_IP"]) == ("rag-workers", PORT)
    for ordinal, node in enumerate(index_nodes):
        assert host_port(config[f"NODE_{node}_IP"]) == (f"rag-index-{ordinal}.{index['spec']['serviceName']}", PORT)
    assert services[index["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    assert {main_container(obj).get("env", [{}])[0].get("value") for obj in by_kind("Deployment").values()} == {"0", "1"}


def test_k8s_services_select_their_pods_on_the_node_port():
    workloads = [*by_kind("Deployment").values(), *by_kind("StatefulSet").values()]
    for service in by_kind("Service").values():
        selected = [w for w in workloads
                    if service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1, service["metadata"]["name"]
        (port,) = service["spec"]["ports"]
        container_ports = {p["name"]: p["containerPort"] for p in main_container(selected[0])["ports"]}
        assert port["port"] == PORT and container_ports[port["targetPort"]] == PORT
    for workload in workloads:
        assert workload["spec"]["selector"]["matchLabels"].items() <= workload["spec"]["template"]["metadata"]["labels"].items()


def test_k8s_probes_resources_and_user():
    for obj in [*by_kind("Deployment").values(), *by_kind("StatefulSet").values()]:
        container = main_container(obj)
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready", obj["metadata"]["name"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/live", obj["metadata"]["name"]
        for c in pod_spec(obj)["containers"] + pod_spec(obj).get("initContainers", []):
            assert {"cpu", "memory"} <= c["resources"]["requests"].keys() <= c["resources"]["limits"].keys()
        assert pod_spec(obj)["securityContext"]["runAsNonRoot"] is True
        assert pod_spec(obj)["terminationGracePeriodSeconds"] > int(env_example()["SHUTDOWN_GRACE_S"])


def test_k8s_autoscaler_scales_the_worker_deployment():
    (hpa,) = by_kind("HorizontalPodAutoscaler").values()
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "rag-worker")
    assert "requests" in main_container(by_kind("Deployment")["rag-worker"])["resources"]
    assert hpa["spec"]["minReplicas"] <= by_kind("Deployment")["rag-worker"]["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]


# ---------------------------------------------------------------- the image


def test_dockerfile_installs_pinned_cpu_torch_first_and_runs_run_sh_as_a_user():
    text = (DEPLOY / "Dockerfile").read_text()
    assert text.startswith("#") and "\nFROM python:3.11-slim\n" in text
    assert text.index("torch==2.13.0") < text.index("pip install .")
    assert re.search(r"^USER rag$", text, flags=re.M) and 'ENTRYPOINT ["./run.sh"]' in text
    # The image writes run.sh's setup stamp the way run.sh computes it, so a container starts offline.
    stamp = "cat setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1"
    assert stamp in text and stamp in (REPO_ROOT / "run.sh").read_text()
    # The torch the image and ./run.sh setup pin lies in the range setup.cfg (and the kernels) accept.
    torch_range = re.search(r"^\s+torch(\S+)$", (REPO_ROOT / "setup.cfg").read_text(), flags=re.M).group(1)
    assert torch_range == TORCH_VERIFIED
    assert Version("2.13.0") in SpecifierSet(torch_range) and "torch==2.13.0" in (REPO_ROOT / "run.sh").read_text()


def test_dockerignore_keeps_local_state_out():
    ignored = set((REPO_ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "data", ".cache", "logs"} <= ignored
    assert not {"pipeline", "services", "builders", "profiling", "run.sh", "setup.cfg"} & ignored


def test_wait_for_data_returns_once_the_data_is_there(tmp_path):
    (tmp_path / "documents").mkdir()
    (tmp_path / "documents" / "documents.db").write_bytes(b"db")
    for shard in range(2):
        shard_path(tmp_path / "faiss_index.bin", shard, 2).write_bytes(b"index")
    env = {**os.environ, "FAISS_INDEX_PATH": str(tmp_path / "faiss_index.bin"), "INDEX_SHARDS": "2",
           "DOCUMENTS_DIR": str(tmp_path / "documents")}
    result = subprocess.run([str(DEPLOY / "wait-for-data.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == ""
