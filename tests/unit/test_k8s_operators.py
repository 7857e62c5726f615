"""deploy/k8s beyond Kubernetes' own kinds, and its optional parts, as rendered: a PodMonitor per role
scraping the port the node serves /metrics on, admitted by the network policies; the PrometheusRule is
the alert rules file; no pod carries prometheus.io/* annotations beside them (a Prometheus reading both
would scrape each pod twice) unless the prometheus-annotations component swaps the PodMonitors for them;
the custom resources validate against their CRDs' schemas (written here: no
CRD can be fetched offline, so each is the subset of the CRD's OpenAPI schema these manifests use,
closed to unknown fields, as the API server's structural schemas are); the adapter rule is written
once; KEDA's ScaledObject replaces the HPA with the HPA's own numbers, in any overlay; a changed
setting renames the settings ConfigMap in every pod (the pods roll); the trial's gateway can be
drained; the components (API keys, Ingress, collector egress, annotation scraping) and the GPU overlay render as their
files say.

kubectl renders the overlays and the components (a process: those tests are slow, and skip without it).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from pipeline.config import REPO_ROOT, Settings
from services.roles.worker.metrics import CONCURRENCY_METRIC
from tests.unit.test_k8s_manifests import (
    K8S,
    OVERLAYS,
    RENDERED,
    SLOW,
    VERSIONS,
    by_kind,
    kubectl_render,
    kubernetes_validate,
    node_container,
    overlay,
    pod_labels,
    pod_spec,
    restricted_violations,
    role_of,
    serving,
    settings_data,
    settings_map,
)
from tools.render_settings import ALERTS_SOURCE

COMPONENTS = K8S / "components"
ROLES = ("gateway", "worker", "index")

STRING, INT = {"type": "string"}, {"type": "integer"}
STRINGS = {"type": "object", "additionalProperties": STRING}


def closed(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


LABEL_SELECTOR = closed({"matchLabels": STRINGS, "matchExpressions": {"type": "array"}})
METADATA = closed({"name": STRING, "namespace": STRING, "labels": STRINGS, "annotations": STRINGS}, ("name",))


def custom_resource(api_version: str, kind: str, spec: dict) -> dict:
    return closed({"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": METADATA, "spec": spec},
                  ("apiVersion", "kind", "metadata", "spec"))


# monitoring.coreos.com/v1 (prometheus-operator 0.7x) and keda.sh/v1alpha1 (KEDA 2.1x): the fields used here.
CRD_SCHEMAS = {
    "PodMonitor": custom_resource("monitoring.coreos.com/v1", "PodMonitor", closed({
        "jobLabel": STRING, "podTargetLabels": {"type": "array", "items": STRING}, "selector": LABEL_SELECTOR,
        "namespaceSelector": closed({"any": {"type": "boolean"}, "matchNames": {"type": "array"}}),
        "podMetricsEndpoints": {"type": "array", "items": closed({
            "port": STRING, "path": STRING, "scheme": {"enum": ["http", "https"]},
            "interval": {"type": "string", "pattern": r"^(0|(\d+(ms|s|m|h))+)$"},
            "scrapeTimeout": {"type": "string", "pattern": r"^(0|(\d+(ms|s|m|h))+)$"},
            "honorLabels": {"type": "boolean"}, "relabelings": {"type": "array"}})}}, ("selector",))),
    "PrometheusRule": custom_resource("monitoring.coreos.com/v1", "PrometheusRule", closed({
        "groups": {"type": "array", "items": closed({
            "name": STRING, "interval": STRING, "rules": {"type": "array", "items": closed({
                "alert": STRING, "record": STRING, "expr": STRING, "for": STRING, "keep_firing_for": STRING,
                "labels": STRINGS, "annotations": STRINGS}, ("expr",))}}, ("name",))}})),
    "ScaledObject": custom_resource("keda.sh/v1alpha1", "ScaledObject", closed({
        "scaleTargetRef": closed({"apiVersion": STRING, "kind": STRING, "name": STRING}, ("name",)),
        "minReplicaCount": INT, "maxReplicaCount": INT, "cooldownPeriod": INT, "pollingInterval": INT,
        "advanced": closed({"restoreToOriginalReplicaCount": {"type": "boolean"},
                            "horizontalPodAutoscalerConfig": closed({"name": STRING, "behavior": {"type": "object"}})}),
        "triggers": {"type": "array", "minItems": 1, "items": closed({
            "type": STRING, "name": STRING, "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
            "metadata": STRINGS, "authenticationRef": {"type": "object"}}, ("type", "metadata"))}},
        ("scaleTargetRef", "triggers"))),
}


def validate_custom(obj: dict) -> None:
    jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
    if obj["kind"] == "ScaledObject":  # the behaviour KEDA hands its HPA: Kubernetes' own schema
        behavior = obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "h"},
               "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "d"}, "maxReplicas": 2, "behavior": behavior}}
        for version in VERSIONS:
            kubernetes_validate.validate(hpa, version, strict=True)


def custom_objects(objects: list[dict]) -> list[dict]:
    return [obj for obj in objects if obj["kind"] in CRD_SCHEMAS]


def test_the_default_has_a_pod_monitor_per_role_on_the_port_that_serves_metrics():
    monitors = by_kind("PodMonitor")
    for obj in serving():
        labels = obj["spec"]["template"]["metadata"]["labels"]
        (monitor,) = [m for m in monitors.values() if m["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        ports = {p["name"]: p["containerPort"] for p in node_container(obj)["ports"]}
        assert endpoint["path"] == "/metrics" and ports[endpoint["port"]] == 8000, obj["metadata"]["name"]
        assert monitor["spec"]["jobLabel"] in labels  # job: a label every pod carries
        assert "namespaceSelector" not in monitor["spec"]  # its own namespace, the pods'
    assert sorted(role_of(m) for m in monitors.values()) == sorted(ROLES)


SCRAPE_ANNOTATIONS = "prometheus.io/"


def scrape_annotations(obj: dict) -> dict[str, str]:
    notes = obj["spec"]["template"]["metadata"].get("annotations", {})
    return {k: v for k, v in notes.items() if k.startswith(SCRAPE_ANNOTATIONS)}


def test_the_default_pods_carry_no_scrape_annotations_beside_the_pod_monitors():
    assert by_kind("PodMonitor")
    assert {obj["metadata"]["name"]: scrape_annotations(obj) for obj in serving()} == \
        {obj["metadata"]["name"]: {} for obj in serving()}


@SLOW
def test_the_annotations_component_scrapes_every_pod_by_annotation_instead_of_the_pod_monitors(tmp_path):
    objects = rendered_with(tmp_path, [K8S], [COMPONENTS / "prometheus-annotations"])
    assert {obj["kind"] for obj in objects} & {"PodMonitor", "PrometheusRule"} == set()  # no Operator CRD needed
    assert sorted(role_of(obj) for obj in serving(objects)) == sorted(role_of(obj) for obj in serving())
    for obj in serving(objects):
        ports = {p["name"]: p["containerPort"] for p in node_container(obj)["ports"]}
        assert scrape_annotations(obj) == {"prometheus.io/scrape": "true", "prometheus.io/port": str(ports["http"]),
                                           "prometheus.io/path": "/metrics"}, obj["metadata"]["name"]
        kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)
    assert [obj for obj in objects if obj["kind"] == "Job" and scrape_annotations(obj)] == []


def test_the_monitoring_namespace_may_reach_every_role():
    for role in ROLES:
        rules = [rule for policy in by_kind("NetworkPolicy").values()
                 if policy["spec"]["podSelector"].get("matchLabels", {}).items() <= pod_labels(role).items()
                 for rule in policy["spec"].get("ingress", [])]
        assert any("from" not in rule or {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name":
                                                                                 "monitoring"}}} in rule["from"]
                   for rule in rules), role


def test_the_prometheus_rule_is_the_alert_rules_file():
    (rule,) = by_kind("PrometheusRule").values()
    assert rule["spec"]["groups"] == yaml.safe_load((REPO_ROOT / ALERTS_SOURCE).read_text())["groups"]


def test_the_custom_resources_validate_against_their_crd_schemas():
    found = custom_objects(RENDERED)
    assert sorted({obj["kind"] for obj in found}) == ["PodMonitor", "PrometheusRule"]
    for obj in found:
        validate_custom(obj)
    (monitor, *_) = by_kind("PodMonitor").values()
    broken = {**monitor, "spec": {**monitor["spec"], "podMetricEndpoints": monitor["spec"]["podMetricsEndpoints"]}}
    with pytest.raises(jsonschema.ValidationError, match="podMetricEndpoints"):
        validate_custom(broken)


def test_the_adapter_rule_is_written_once_and_a_new_adapters_values_point_at_prometheus():
    folder = K8S / "prometheus-adapter"
    values, rule = (yaml.safe_load((folder / name).read_text()) for name in ("values.yaml", "rule.yaml"))
    assert set(rule) == {"rules"} and set(rule["rules"]) == {"custom"}  # a values file holding the rule alone
    assert "custom" not in values["rules"] and urlsplit(values["prometheus"]["url"]).scheme == "http"
    assert "--set prometheus.url=" in (folder / "values.yaml").read_text()


def rendered_with(tmp_path: Path, resources: list[Path], components: list[Path], **extra) -> list[dict]:
    """A kustomization in tmp_path over `resources` with `components` (kustomize takes relative paths)."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the components are rendered by kubectl only")
    relative = lambda paths: [os.path.relpath(p, tmp_path) for p in paths]  # noqa: E731
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(
        {"resources": relative(resources), "components": relative(components), **extra}))
    rendered = kubectl_render(tmp_path)
    assert rendered is not None
    return rendered


def assert_keda_follows_the_hpa(objects: list[dict], hpa: dict) -> None:
    assert by_kind("HorizontalPodAutoscaler", objects) == {}  # never both scaling the workers
    (scaled,) = by_kind("ScaledObject", objects).values()
    validate_custom(scaled)
    spec, (trigger,) = scaled["spec"], scaled["spec"]["triggers"]
    assert spec["scaleTargetRef"] == hpa["spec"]["scaleTargetRef"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"])
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["spec"]["behavior"]
    assert spec["cooldownPeriod"] == hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
    assert trigger["metadata"]["threshold"] == hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"]
    assert f"{CONCURRENCY_METRIC}{{" in trigger["metadata"]["query"] and 'pod=~"rag-worker-' in trigger["metadata"]["query"]


@SLOW
def test_keda_replaces_the_hpa_with_its_numbers(tmp_path):
    (hpa,) = by_kind("HorizontalPodAutoscaler").values()
    assert_keda_follows_the_hpa(overlay("keda"), hpa)
    # Over the trial, whose HPA is capped at 2: KEDA takes the trial's numbers, not the default's.
    (trial_hpa,) = by_kind("HorizontalPodAutoscaler", overlay("trial")).values()
    assert trial_hpa["spec"]["maxReplicas"] != hpa["spec"]["maxReplicas"]
    assert_keda_follows_the_hpa(rendered_with(tmp_path, [OVERLAYS / "trial"], [COMPONENTS / "keda"]), trial_hpa)


@SLOW
def test_a_changed_setting_renames_the_settings_in_every_pod_so_they_roll(tmp_path):
    before = kubectl_render()
    assert before is not None
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    env = copy / "settings.env"
    env.write_text(env.read_text().replace("\nFAISS_MMAP=true\n", "\nFAISS_MMAP=false\n"))
    after = kubectl_render(copy)
    assert after is not None
    old, new = settings_map(before)["metadata"]["name"], settings_map(after)["metadata"]["name"]
    assert old != new and settings_data(after)["FAISS_MMAP"] == "false"
    for obj_before, obj_after in zip(serving(before), serving(after)):
        refs = lambda obj: [r["configMapRef"]["name"] for c in pod_spec(obj)["containers"] + pod_spec(obj)["initContainers"]  # noqa: E731
                            for r in c.get("envFrom", []) if "configMapRef" in r]
        assert old in refs(obj_before) and new in refs(obj_after) and old not in refs(obj_after)
    assert "rag-data" in by_kind("ConfigMap", after)  # the data version: switched by the rollout, not by restarts


@SLOW
def test_the_trials_single_gateway_may_be_drained():
    objects = overlay("trial")
    replicas = by_kind("Deployment", objects)["rag-gateway"]["spec"]["replicas"]
    budget = by_kind("PodDisruptionBudget", objects)["rag-gateway"]["spec"]
    assert replicas == 1 and (budget.get("maxUnavailable", 0) >= 1 or budget.get("minAvailable", 1) < replicas)
    assert by_kind("PodDisruptionBudget")["rag-gateway"]["spec"]["minAvailable"] == 1  # two in the default: one stays


@SLOW
def test_the_components_render_valid_restricted_objects_as_their_files_say(tmp_path):
    objects = rendered_with(tmp_path, [K8S], [COMPONENTS / name for name in ("api-keys", "ingress", "otel-egress")])
    for obj in objects:
        if obj["kind"] not in CRD_SCHEMAS:
            kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)
    gateway = by_kind("Deployment", objects)["rag-gateway"]
    assert restricted_violations(gateway) == []
    # API keys: the gateway alone reads the file, from the Secret mounted read-only where the setting points.
    env = {e["name"]: e["value"] for e in node_container(gateway)["env"]}
    settings = Settings.from_env({**settings_data(objects), **env, "CLUSTER_TOKEN": "t"})
    keys_file = settings.api.api_keys_file
    (mount,) = [m for m in node_container(gateway)["volumeMounts"] if m["name"] == "api-keys"]
    assert keys_file is not None and keys_file.parent == Path(mount["mountPath"]) and mount["readOnly"] is True
    (volume,) = [v for v in pod_spec(gateway)["volumes"] if v["name"] == "api-keys"]
    assert volume["secret"]["secretName"] == "rag-api-keys"
    assert "API_KEYS_FILE" not in {e["name"] for e in node_container(by_kind("Deployment", objects)["rag-worker"]).get("env", [])}
    # The Ingress: to the gateways' Service, with proxy timeouts past a request's own deadline, unbuffered.
    (ingress,) = by_kind("Ingress", objects).values()
    (path,) = ingress["spec"]["rules"][0]["http"]["paths"]
    assert path["backend"]["service"] == {"name": "rag-gateway", "port": {"name": "http"}}
    notes = ingress["metadata"]["annotations"]
    deadline = float(settings_data(objects)["REQUEST_TIMEOUT_S"])
    assert min(float(notes[f"nginx.ingress.kubernetes.io/proxy-{d}-timeout"]) for d in ("read", "send")) > deadline
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    # Traces: on, to the collector the egress rule admits (its port), which the default denies.
    data = settings_data(objects)
    port = urlsplit(data["TRACING_ENDPOINT"]).port
    egress = by_kind("NetworkPolicy", objects)["rag-otel-egress"]["spec"]
    assert data["TRACING"] == "otlp" and port in {p["port"] for rule in egress["egress"] for p in rule["ports"]}
    assert egress["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "rag"}
    assert "rag-otel-egress" not in by_kind("NetworkPolicy") and settings_data()["TRACING"] == "off"


@SLOW
def test_the_gpu_overlay_puts_the_workers_alone_on_a_gpu_each_with_their_own_target():
    objects = overlay("gpu")
    (hpa,) = by_kind("HorizontalPodAutoscaler", objects).values()
    (default_hpa,) = by_kind("HorizontalPodAutoscaler").values()
    target = lambda h: float(h["spec"]["metrics"][0]["pods"]["target"]["averageValue"])  # noqa: E731
    assert target(hpa) > target(default_hpa)
    for obj in serving(objects):
        spec, node = pod_spec(obj), node_container(obj)
        on_gpu = role_of(obj) == "worker"
        assert (node["resources"]["limits"].get("nvidia.com/gpu") == 1) is on_gpu, obj["metadata"]["name"]
        assert (spec.get("nodeSelector") == {"nvidia.com/gpu.present": "true"}) is on_gpu
        images = {c["image"].split(":")[0] for c in spec["containers"] + spec["initContainers"]}
        assert images == ({"rag-service-gpu"} if on_gpu else {"rag-service"}), obj["metadata"]["name"]
        if on_gpu:
            assert node["resources"]["requests"]["nvidia.com/gpu"] == 1
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
            assert obj["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0  # no spare GPU is assumed
