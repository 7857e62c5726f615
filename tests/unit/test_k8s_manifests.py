"""deploy/k8s as an operator would apply it: the RENDERED kustomize output (kubectl kustomize where
installed, else the small renderer below, which the test holds to kubectl's output where both run)
validates against several Kubernetes versions' schemas (kubernetes-validate, offline, strict), every
pod meets the "restricted" Pod Security Standard (checked rule by rule: no linter installs offline),
each role has a disruption budget, the network policies let only the gateways reach the workers and
only the searching nodes reach the index, and the wiring (node numbers, names, shards) agrees.

No cluster can be started here: these check what `kubectl apply -k deploy/k8s` would send.
"""
from __future__ import annotations

import copy
import re
import shutil
import subprocess

import pytest
import yaml

from pipeline.config import REPO_ROOT, ConfigError, Settings

kubernetes_validate = pytest.importorskip("kubernetes_validate")

K8S = REPO_ROOT / "deploy" / "k8s"
VERSIONS = ("1.30", "1.33", "1.37")  # a supported range of minor versions, oldest to newest
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")
PORT = 8000
# The restricted standard's allowed volume types (Pod Security Standards, "Volume Types").
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def python_render() -> list[dict]:
    """What `kubectl kustomize deploy/k8s` makes of this kustomization's features: its resources in
    order, the namespace set on namespaced objects, image tags set, strategic-merge patches of
    ConfigMap data applied."""
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    supported = {"apiVersion", "kind", "namespace", "resources", "patches", "images"}
    assert set(k) <= supported, f"the renderer does not know {set(k) - supported}: extend it"
    objects = [doc for name in k["resources"] for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]
    tags = {image["name"]: f"{image['name']}:{image['newTag']}" for image in k.get("images", [])}
    for obj in objects:
        if obj["kind"] != "Namespace":
            obj["metadata"]["namespace"] = k["namespace"]
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            container["image"] = tags.get(container["image"], container["image"])
    for patch in k.get("patches", []):
        target, body = patch["target"], yaml.safe_load(patch["patch"])
        assert target["kind"] == "ConfigMap" and set(body) <= {"apiVersion", "kind", "metadata", "data"}
        for obj in objects:
            if obj["kind"] == target["kind"] and obj["metadata"]["name"] == target["name"]:
                obj["data"].update(body["data"])
    return objects


def kubectl_render() -> list[dict] | None:
    if shutil.which("kubectl") is None:
        return None
    result = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


RENDERED = kubectl_render() or python_render()


def by_kind(kind: str) -> dict[str, dict]:
    return {obj["metadata"]["name"]: obj for obj in RENDERED if obj["kind"] == kind}


def workloads() -> list[dict]:
    return [obj for obj in RENDERED if obj["kind"] in WORKLOAD_KINDS]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def containers(obj: dict) -> list[dict]:
    return pod_spec(obj)["containers"] + pod_spec(obj).get("initContainers", [])


def node_container(obj: dict) -> dict:
    (container,) = pod_spec(obj)["containers"]
    return container


def settings_data() -> dict[str, str]:
    return by_kind("ConfigMap")["rag-settings"]["data"]


# ---------------------------------------------------------------- rendering and schemas


def test_the_python_renderer_agrees_with_kubectl():
    rendered = kubectl_render()
    if rendered is None:
        pytest.skip("kubectl is not installed: the Python renderer stands in")
    key = lambda obj: (obj["kind"], obj["metadata"]["name"])  # noqa: E731
    assert sorted(python_render(), key=key) == sorted(rendered, key=key)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_rendered_objects_validate_against_the_kubernetes_schemas(version):
    kinds = {obj["kind"] for obj in RENDERED}
    assert {"Namespace", "ConfigMap", "PersistentVolumeClaim", "Job", "Service", "StatefulSet", "Deployment",
            "PodDisruptionBudget", "NetworkPolicy"} <= kinds
    for obj in RENDERED:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("break_it", [
    lambda d: d["spec"].__setitem__("replicas", "two"),
    lambda d: d["spec"]["template"]["spec"]["containers"][0].__setitem__("readinesProbe", {}),
    lambda d: d["spec"]["template"]["spec"]["containers"][0]["securityContext"].__setitem__("runAsNonRoot", "yes"),
])
def test_the_schema_validator_rejects_a_broken_object(break_it):
    broken = copy.deepcopy(by_kind("StatefulSet")["rag-worker"])
    break_it(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


# ---------------------------------------------------------------- the restricted Pod Security Standard


def restricted_violations(obj: dict) -> list[str]:
    """Each rule of the "restricted" standard (and of "baseline", which it includes) a pod breaks,
    plus a writable root filesystem (this project's own rule: write only to volumes)."""
    pod, name, problems = pod_spec(obj), obj["metadata"]["name"], []
    pod_context = pod.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            problems.append(f"{name}: {flag}")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"{name}: volume {volume['name']} is {kinds}")
    for c in containers(obj):
        context, where = c.get("securityContext", {}), f"{name}/{c['name']}"
        merged = {**pod_context, **context}
        if merged.get("runAsNonRoot") is not True:
            problems.append(f"{where}: runAsNonRoot is not true")
        if merged.get("runAsUser") == 0:
            problems.append(f"{where}: runAsUser 0")
        if merged.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile is not RuntimeDefault")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        if context.get("privileged"):
            problems.append(f"{where}: privileged")
        capabilities = context.get("capabilities", {})
        if capabilities.get("drop") != ["ALL"] or set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: capabilities are not drop [ALL]")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: the root filesystem is writable")
        if any(port.get("hostPort") for port in c.get("ports", [])):
            problems.append(f"{where}: hostPort")
    return problems


def test_every_pod_meets_the_restricted_pod_security_standard():
    assert len(workloads()) >= 4
    assert [p for obj in workloads() for p in restricted_violations(obj)] == []
    namespace = by_kind("Namespace")["rag"]["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("break_it,rule", [
    (lambda pod: pod["securityContext"].pop("seccompProfile"), "seccompProfile"),
    (lambda pod: pod["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"), "allowPrivilegeEscalation"),
    (lambda pod: pod["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]), "capabilities"),
    (lambda pod: pod["containers"][0]["securityContext"].update(readOnlyRootFilesystem=False), "root filesystem"),
    (lambda pod: pod["securityContext"].update(runAsNonRoot=False), "runAsNonRoot"),
    (lambda pod: pod.update(hostNetwork=True), "hostNetwork"),
    (lambda pod: pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "volume h"),
])
def test_the_policy_check_catches_each_rule(break_it, rule):
    broken = copy.deepcopy(by_kind("StatefulSet")["rag-index"])
    break_it(pod_spec(broken))
    assert any(rule in problem for problem in restricted_violations(broken))


def test_writable_volumes_only_where_needed():
    for obj in workloads():
        for c in containers(obj):
            writable = {m["mountPath"] for m in c.get("volumeMounts", []) if not m.get("readOnly")}
            allowed = {"/tmp", "/data", "/standins"} if c["name"] == "fill-data" else \
                {"/home/rag/.cache/huggingface", "/tmp"} if obj["kind"] == "Job" else {"/tmp"}
            assert writable <= allowed, (obj["metadata"]["name"], c["name"], writable)


# ---------------------------------------------------------------- availability and network policy


def test_a_disruption_budget_per_role():
    budgets = by_kind("PodDisruptionBudget").values()
    roles = {b["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]: b["spec"] for b in budgets}
    assert set(roles) == {"gateway", "worker", "index"}
    assert roles["gateway"]["minAvailable"] == 1 and roles["worker"]["maxUnavailable"] == 1
    # One index pod at a time, with two replicas per shard: a drain never takes a shard away.
    assert roles["index"]["maxUnavailable"] == 1
    assert by_kind("StatefulSet")["rag-index"]["spec"]["replicas"] == 2 * int(settings_data()["INDEX_SHARDS"])


def pod_labels(role: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "rag", "app.kubernetes.io/component": role}


def may_reach(source: dict[str, str] | None, target: str) -> bool:
    """Whether pods labelled `source` (None: outside the namespace) may open port 8000 on `target`'s pods."""
    selecting = [p["spec"] for p in by_kind("NetworkPolicy").values()
                 if p["spec"]["podSelector"].get("matchLabels", {}).items() <= pod_labels(target).items()
                 and "Ingress" in p["spec"]["policyTypes"]]
    assert selecting, f"no policy selects the {target} pods"
    for policy in selecting:
        for rule in policy.get("ingress", []):
            ports = {p["port"] for p in rule.get("ports", [])}
            if ports and PORT not in ports:
                continue
            peers = rule.get("from")
            if peers is None or any(source is not None and "podSelector" in peer and "namespaceSelector" not in peer
                                    and peer["podSelector"]["matchLabels"].items() <= source.items() for peer in peers):
                return True
    return False


def test_only_gateways_reach_the_workers_and_only_searching_nodes_reach_the_index():
    gateway, worker, index = pod_labels("gateway"), pod_labels("worker"), pod_labels("index")
    assert may_reach(None, "gateway") and may_reach(gateway, "gateway")
    assert may_reach(gateway, "worker") and not may_reach(worker, "worker") and not may_reach(index, "worker")
    assert not may_reach(None, "worker")
    # Node 0 is a worker too: the gateways search the index, as the workers do.
    assert may_reach(worker, "index") and may_reach(gateway, "index")
    assert not may_reach(index, "index") and not may_reach(None, "index")


# ---------------------------------------------------------------- topology, token, storage


def node_offset(obj: dict) -> int:
    """The n in the container's NODE_NUMBER=$((ordinal + n))."""
    (offset,) = re.findall(r"NODE_NUMBER=\$\$\(\(\$\{HOSTNAME##\*-\} \+ (\d+)\)\)", " ".join(node_container(obj)["command"]))
    return int(offset)


def test_the_topology_names_every_pod_once():
    data, sets, services = settings_data(), by_kind("StatefulSet"), by_kind("Service")
    workers, index = sets["rag-worker"], sets["rag-index"]
    assert node_offset(workers) == 1 and node_offset(index) == 1 + workers["spec"]["replicas"]
    assert int(data["TOTAL_NODES"]) == 1 + workers["spec"]["replicas"] + index["spec"]["replicas"]
    assert data["NODE_0_IP"] == f"rag-gateway:{PORT}"
    for obj in (workers, index):
        service = services[obj["spec"]["serviceName"]]
        assert service["spec"]["clusterIP"] == "None"  # headless: a DNS name per pod
        for ordinal in range(obj["spec"]["replicas"]):
            address = f"{obj['metadata']['name']}-{ordinal}.{service['metadata']['name']}:{PORT}"
            assert data[f"NODE_{ordinal + node_offset(obj)}_IP"] == address
    assert data["INDEX_NODES"] == ",".join(str(o + node_offset(index)) for o in range(index["spec"]["replicas"]))
    assert by_kind("Deployment")["rag-gateway"]["spec"]["replicas"] >= 2
    assert node_container(by_kind("Deployment")["rag-gateway"])["env"] == [{"name": "NODE_NUMBER", "value": "0"}]


def test_every_node_requires_the_cluster_token_and_refuses_to_start_without_it():
    data = settings_data()
    for obj in workloads():
        if obj["kind"] == "Job":
            continue
        secrets = [ref["secretRef"] for ref in node_container(obj)["envFrom"] if "secretRef" in ref]
        assert secrets == [{"name": "rag-secrets"}], obj["metadata"]["name"]  # not optional
    for node in range(int(data["TOTAL_NODES"])):
        with pytest.raises(ConfigError, match="CLUSTER_TOKEN"):
            Settings.from_env({**data, "NODE_NUMBER": str(node)})
        assert Settings.from_env({**data, "NODE_NUMBER": str(node), "CLUSTER_TOKEN": "t"}).cluster.node_number == node


def test_index_and_worker_data_is_per_pod_read_write_once():
    for name in ("rag-index", "rag-worker"):
        (template,) = by_kind("StatefulSet")[name]["spec"]["volumeClaimTemplates"]
        assert template["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert all("ReadWriteMany" not in pvc["spec"]["accessModes"] for pvc in by_kind("PersistentVolumeClaim").values())


def test_a_job_fills_the_model_cache_for_the_hub_source():
    (job,) = by_kind("Job").values()
    command = " ".join(node_container(job)["command"])
    assert "snapshot_download" in command and "ALL_MODELS" in command and "pipeline.provision" in command
    (mount,) = [m for m in node_container(job)["volumeMounts"] if m["name"] == "models"]
    assert mount["mountPath"] == "/home/rag/.cache/huggingface" and not mount.get("readOnly")
    claim = next(v for v in pod_spec(job)["volumes"] if v["name"] == "models")["persistentVolumeClaim"]["claimName"]
    assert claim in by_kind("PersistentVolumeClaim")


def test_probes_resources_and_grace():
    grace = Settings.from_env({}).limits.shutdown_grace_s
    for obj in workloads():
        for c in containers(obj):
            assert {"cpu", "memory"} <= c["resources"]["requests"].keys() <= c["resources"]["limits"].keys()
        if obj["kind"] != "Job":
            assert node_container(obj)["readinessProbe"]["httpGet"]["path"] == "/ready"
            assert node_container(obj)["livenessProbe"]["httpGet"]["path"] == "/live"
            assert pod_spec(obj)["terminationGracePeriodSeconds"] > grace
