"""One's own documents through the image, end to end (issue 48), as deploy/compose.yaml's `data`
service does it: a container builds the tiny stand-ins and runs `./run.sh ingest` on a mounted
folder of Markdown, text and HTML into a data volume; three node containers (index, worker,
gateway+worker) serve that version, and a reply's `sources` name the ingested documents by id
and title. The nodes run with TRACING=otlp, configured only by OTEL_* variables: their spans
reach a receiver on 127.0.0.1 (the image carries OpenTelemetry).

Needs a Docker daemon and the base image or debootstrap (tests/support/containers.py: skips,
saying why, without); the containers use the host's network, on 127.0.0.1 only. A few minutes
on 2 cores with the image built (its build is shared with test_containers.py through the cache).
"""
from __future__ import annotations

import json
import os
import re
import time
import uuid

import pytest
import requests

from tests.helpers import wait_until
from tests.support.containers import IMAGE, built_image, docker
from tests.support.otlp_receiver import OtlpReceiver
from tools.local import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

START_S = 300  # three nodes with tiny stand-ins on 2 cores, with margin (SPEC: 5 minutes per node)
DOCUMENTS = {
    "returns/blender.md": "# Returning the Zephyr blender\n\nA Zephyr blender may be returned within 45 days "
                          "of delivery.\n\n## Refunds\n\nRefunds for a returned blender reach the card in five days.\n",
    "shipping.txt": "Parcels to Iceland travel by sea and take three weeks to arrive.\n",
    "warranty.html": "<html><head><title>Kettle warranty</title><script>var x = 1;</script></head><body>"
                     "<nav>Home | Shop</nav><main><h1>Warranty</h1><p>Every kettle carries a two-year "
                     "warranty.</p></main></body></html>",
}
TITLES = {"returns/blender.md": "Returning the Zephyr blender", "shipping.txt": "shipping.txt",
          "warranty.html": "Kettle warranty"}
STANDINS = "tiny"
MODELS = {"MODEL_SOURCE": "standin", "STANDIN_PROFILE": STANDINS, "STANDIN_HOME": "/standins/home",
          "HF_HUB_OFFLINE": "1"}


def env_args(env: dict[str, str]) -> list[str]:
    return [arg for name, value in env.items() for arg in ("-e", f"{name}={value}")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    with built_image(tmp_path_factory.mktemp("checkout")) as image:
        yield image


@pytest.fixture(scope="module")
def ingested(built, tmp_path_factory):
    """Named volumes holding the stand-ins and data version v1 ingested from a mounted folder
    (/data/current -> v1), and what the ingest printed."""
    knowledge = tmp_path_factory.mktemp("knowledge")
    for name, text in DOCUMENTS.items():
        (knowledge / name).parent.mkdir(parents=True, exist_ok=True)
        (knowledge / name).write_text(text)
    for folder in (knowledge, *(p for p in knowledge.rglob("*") if p.is_dir())):
        folder.chmod(0o755)  # the container's user (10001) reads it; pytest's folders are 0700
    volumes = {v: f"ragingest{os.getpid()}-{v}" for v in ("data", "standins")}
    started = time.monotonic()
    try:
        done = docker("run", "--rm", "--network", "none", *env_args(MODELS),
                      "-v", f"{knowledge}:/knowledge:ro", "-v", f"{volumes['data']}:/data",
                      "-v", f"{volumes['standins']}:/standins", "--entrypoint", "sh", IMAGE, "-ec",
                      f"python -m builders.standins --profile {STANDINS} --hf-home /standins/home --quiet; "
                      "./run.sh ingest /knowledge --out /data/v1 --no-progress; ln -s v1 /data/current",
                      timeout=900)
        print(f"\n[containers] stand-ins and ingest in a container: {time.monotonic() - started:.0f} s")
        yield {"volumes": volumes, "output": done.stdout + done.stderr}
    finally:
        docker("volume", "rm", "-f", *volumes.values(), check=False)


@pytest.fixture(scope="module")
def receiver():
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def cluster(ingested, receiver):
    """Nodes 2 (index), 1 (worker) and 0 (gateway and worker), each a container on the host's
    network, serving /data/current read-only; node 0's URL."""
    ports = free_ports(3)
    env = {**MODELS, "TOTAL_NODES": "3", **{f"NODE_{n}_IP": f"127.0.0.1:{p}" for n, p in enumerate(ports)},
           "FAISS_INDEX_PATH": "/data/current/faiss_index.bin", "DOCUMENTS_DIR": "/data/current/documents",
           "PRECISION": "float32", "ONLY_CPU": "true", "TORCH_THREADS": "1", "FAISS_THREADS": "1",
           "HEALTH_INTERVAL_S": "0.5", "TRACING": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
           "OTEL_SERVICE_NAME": "rag-in-a-container", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci"}
    volumes = ingested["volumes"]
    names = {n: f"ragingest{os.getpid()}-node{n}-{uuid.uuid4().hex[:6]}" for n in (2, 1, 0)}
    url = f"http://127.0.0.1:{ports[0]}"
    started = time.monotonic()

    def logs() -> str:
        return "\n".join(f"--- node {n}\n" + docker("logs", "--tail", "30", name, check=False).stderr[-3000:]
                         for n, name in names.items())

    def ready() -> bool:
        try:
            body = requests.get(f"{url}/health", timeout=3).json()
        except (requests.RequestException, ValueError):
            return False
        workers = body.get("workers") or []
        return body.get("status") == "healthy" and len(workers) == 2 and all(w.get("up") for w in workers)

    try:
        for node, name in names.items():
            docker("run", "-d", "--name", name, "--network", "host", *env_args({**env, "NODE_NUMBER": str(node)}),
                   "-v", f"{volumes['data']}:/data:ro", "-v", f"{volumes['standins']}:/standins:ro", IMAGE)
        wait_until(ready, START_S, lambda: f"the containers did not serve:\n{logs()}", poll_s=0.5)
        print(f"\n[containers] three node containers serving in {time.monotonic() - started:.0f} s")
        yield url
    finally:
        for name in names.values():
            docker("rm", "-f", name, check=False, timeout=120)


def test_a_container_ingests_the_mounted_folder(ingested):
    output = ingested["output"]
    assert re.search(rf"^ingested {len(DOCUMENTS)} documents into \d+ passages: data version v1$", output,
                     flags=re.M), output[-3000:]
    manifest = json.loads(docker("run", "--rm", "--network", "none", "-v", f"{ingested['volumes']['data']}:/data:ro",
                                 "--entrypoint", "cat", IMAGE, "/data/current/manifest.json").stdout)
    assert manifest["version"] == "v1" and manifest["documents"] >= len(DOCUMENTS), manifest


def test_a_node_in_a_container_answers_citing_the_ingested_documents(cluster):
    reply = requests.post(f"{cluster}/query", json={"request_id": "ingested-1", "query": "How do I return my blender?"},
                          timeout=300)
    assert reply.status_code == 200, reply.text[:500]
    sources = reply.json()["sources"]
    assert sources, reply.json()
    for source in sources:  # every passage the answer was given is one of the mounted folder's
        assert source["document"] in DOCUMENTS and source["title"] == TITLES[source["document"]], source


def test_the_containers_send_their_spans_where_the_otel_variables_say(cluster, receiver):
    reply = requests.post(f"{cluster}/query", json={"request_id": "traced-1", "query": "Is my kettle covered?"},
                          headers={"X-Request-ID": "traced-in-a-container"}, timeout=300)
    assert reply.status_code == 200, reply.text[:500]

    def traced() -> list:
        return [(r, s) for r, s in receiver.spans() if s.name == "POST /query"
                and any(a.key == "rag.request_id" and a.value.string_value == "traced-in-a-container"
                        for a in s.attributes)]

    wait_until(traced, 30, "node 0's span of the request did not reach the receiver", poll_s=0.2)
    (resource, span), = traced()
    assert resource["service.name"] == "rag-in-a-container" and resource["deployment.environment"] == "ci"
    assert resource["rag.node"] == 0
    # The trace crossed into the index container: its /search server span is in the same trace.
    wait_until(lambda: [s for r, s in receiver.spans() if r["rag.node"] == 2 and s.trace_id == span.trace_id], 30,
               "the index container's span of the request did not arrive", poll_s=0.2)
