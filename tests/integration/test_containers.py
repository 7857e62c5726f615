"""The image and the compose topology, for real: deploy/Dockerfile builds from a clean checkout
(the base made offline by deploy/make-base-image.sh, torch from this machine's wheel folder),
then `docker compose up` on deploy/compose.yaml serves one's own documents (issue 48): its one-shot
`data` service ingests a mounted folder of Markdown, text and HTML as two index shards, and the
nodes (the gateway, the `worker` service's two containers, two index shards) come up with the
host's tiny stand-ins mounted read-only, answer the eight client queries as the reference pipeline
does with every source a file of that folder, send their spans where the OTEL_* variables say,
scale the workers 2 -> 1 -> 3 -> 1 under a steady load answering every request, lose no accepted
request when a worker and then an index shard are killed under load, and drain on `down`. A
configuration error is not restarted forever. (The demo corpus, which the `data` service builds
from an empty folder, is fill-data.sh's other branch: tests/unit/test_deploy_manifests.py.)

Needs a Docker daemon (./run.sh test starts one as root: deploy/install-container-tools.sh),
debootstrap or the base image, and Docker Compose (the test extra); skips, saying why, without.
One image build serves every test (module fixture); the build cache makes a rebuild quick.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import yaml

from pipeline import spec
from pipeline.config import Settings
from pipeline.vector_index import ShardedVectorIndex
from tests.helpers import wait_until
from tests.support.containers import (
    DOCKER,
    IMAGE,
    START_S,
    BridgeOtlpReceiver,
    Compose,
    bridge_gateway,
    build,
    build_steps,
    built_image,
    docker,
    write_folder,
)
from tests.support.steady_load import SteadyLoad, unanswered
from tools.local import free_ports
from tools.topology import COMPOSE_TOPOLOGY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

# The mounted folder the `data` service ingests: one file of each kind the ingest reads as text.
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
QUERIES = (*spec.REFERENCE_QUERIES, "How do I return my blender?")  # the client's, and one for the folder


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    with built_image(tmp_path_factory.mktemp("checkout")) as image:
        yield image


def test_the_image_runs_as_a_numeric_user_with_the_kernel_and_no_compiler(built):
    config = json.loads(docker("image", "inspect", IMAGE).stdout)[0]["Config"]
    assert config["User"] == "10001:10001"
    assert config["Healthcheck"]["Test"][:2] == ["CMD", "python"]
    probe = ("import os, shutil, services.node; from pipeline.kernels.fused_int8 import fused_ops; "
             "from pipeline.kernels.ordered_attention import EXTENSION; from pipeline.kernels import vnni_int8; "
             "assert fused_ops() is not None and EXTENSION.ops() is not None, 'kernel not built'; "
             "assert vnni_int8.EXTENSION.ops() is not None or not vnni_int8.EXTENSION.cpu_supported(), 'no vnni'; "
             "assert os.path.isfile(services.node.__cached__), 'the code is not compiled'; "
             "assert not any(map(shutil.which, ('g++', 'gcc', 'c++'))), 'a compiler is left'; print('ok')")
    run = docker("run", "--rm", "--network", "none", "--entrypoint", "python", IMAGE, "-c", probe)
    assert run.stdout.strip() == "ok", run.stderr
    # run.sh's setup, as every node start runs it, finds the kernel built: no compiler, no lock, no warning.
    settings = docker("run", "--rm", "--network", "none", IMAGE, "settings")
    assert "[run.sh]" not in settings.stderr, settings.stderr


def test_a_code_change_rebuilds_neither_torch_nor_the_compiler(built):
    changed = built["context"] / "services" / "node.py"
    changed.write_text(changed.read_text() + "\n# a code change\n")
    seconds, log = build(built["context"], built["wheels"])
    steps, cached = build_steps(log)
    for step in ("torch==2.13.0", "-r /tmp/requirements.txt", "install -y --no-install-recommends g++",
                 "python -m pipeline.kernels.compiled"):
        numbers = [n for n, name in steps.items() if step in name]
        assert numbers and set(numbers) <= cached, f"{step!r} ran again:\n{log[-4000:]}"
    assert set(steps) - cached, "the code change rebuilt nothing"
    print(f"\n[containers] rebuild after a code change {seconds:.0f} s")


# ---------------------------------------------------------------- compose

@pytest.fixture(scope="module")
def receiver(built):
    with BridgeOtlpReceiver(bridge_gateway()) as receiver:
        yield receiver


@pytest.fixture(scope="module")
def cluster(built, receiver, tiny_settings, model_source, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("compose")
    tracing = {"TRACING": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
               "OTEL_SERVICE_NAME": "rag-in-a-container", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci"}
    compose = Compose(f"ragtest{os.getpid()}", workdir, free_ports(1)[0], environment=tracing,
                      knowledge=write_folder(workdir / "knowledge", DOCUMENTS), standins=tiny_settings.standin_dir)
    started = time.monotonic()
    try:
        compose("up", "-d", "--no-build", timeout=START_S)
        health = compose.wait_rotation(START_S)
        print(f"\n[containers] compose up to every worker in rotation: {time.monotonic() - started:.0f} s")
        # node 0's own worker and the two containers of the `worker` service it discovered.
        assert len(health["workers"]) == 3 and health["total_nodes"] == 4
        yield compose
    finally:
        compose("down", "-v", "--timeout", "10", timeout=300, check=False)


@pytest.fixture(scope="module")
def data_volume(cluster, tmp_path_factory):
    """A copy of what the one-shot `data` service wrote (/data/current -> v1)."""
    out = tmp_path_factory.mktemp("volumes") / "data"
    docker("cp", f"{cluster.container('data')}:/data", str(out))
    return out


@pytest.fixture(scope="module")
def reference_answers(data_volume, tiny_settings, embedder, reranker, generator, sentiment, toxicity):
    """The reference pipeline over the data the nodes serve, with the models of the stand-ins they mount
    (the session's, loaded in float32 as the nodes are told to run)."""
    from pipeline.docstore import DocumentStore
    from pipeline.reference import ReferencePipeline
    settings = Settings.from_env({
        "MODEL_SOURCE": "standin", "STANDIN_PROFILE": "tiny", "STANDIN_HOME": str(tiny_settings.standin_dir),
        "PRECISION": "float32", "ONLY_CPU": "true", "TOTAL_NODES": "4", "INDEX_NODES": "2,3", "INDEX_SHARDS": "2",
        "FAISS_INDEX_PATH": str(data_volume / "current" / "faiss_index.bin"),
        "DOCUMENTS_DIR": str(data_volume / "current" / "documents")})
    reference = ReferencePipeline(
        embedder=embedder, index=ShardedVectorIndex.load(settings.require_index_files(), nprobe=settings.index.nprobe),
        store=DocumentStore(settings.require_documents()), reranker=reranker, generator=generator,
        sentiment=sentiment, toxicity=toxicity)
    return {query: reference.answer(query, "") for query in QUERIES}


def post(url: str, request_id: str, query: str) -> requests.Response:
    # Past REQUEST_TIMEOUT_S (280 s): the gateway's own answer at its deadline comes first.
    return requests.post(f"{url}/query", json={"request_id": request_id, "query": query}, timeout=400)


def check_answer(response: requests.Response, query: str, reference_answers: dict) -> None:
    """200 with the reference's answer, or a clear 503 (JSON error, Retry-After)."""
    assert response.headers["Content-Type"].startswith("application/json"), response.text[:300]
    body = response.json()
    if response.status_code == 503:
        assert isinstance(body["error"], str) and body["error"] and int(response.headers["Retry-After"]) >= 1
        return
    assert response.status_code == 200, (response.status_code, response.text[:300])
    expected = reference_answers[query]
    assert {k: body[k] for k in expected if k != "request_id"} == \
        {k: v for k, v in expected.items() if k != "request_id"}, f"{query!r} differs from the reference"


def test_the_data_service_ingests_the_mounted_folder(cluster, data_volume):
    output = cluster("logs", "--no-color", "data").stdout
    ingested = re.search(rf"ingested {len(DOCUMENTS)} documents into (\d+) passages: data version v1$", output,
                         flags=re.M)
    assert ingested, output[-3000:]
    manifest = json.loads((data_volume / "current" / "manifest.json").read_text())
    shards = COMPOSE_TOPOLOGY.shards
    assert (manifest["version"], manifest["kind"], manifest["shards"]) == ("v1", "ingest", shards), manifest
    assert (manifest["ingest"]["documents"], manifest["ingest"]["passages"], manifest["ingest"]["formats"]) == \
        (len(DOCUMENTS), int(ingested.group(1)), {"html": 1, "markdown": 1, "text": 1}), manifest["ingest"]
    assert sorted(p.name for p in (data_volume / "v1").glob("faiss_index.shard-*.bin")) == \
        [f"faiss_index.shard-{shard}-of-{shards}.bin" for shard in range(shards)]


def check_sources(reply: requests.Response) -> None:
    """Every passage the answer was given is one of the mounted folder's files, with its title."""
    sources = reply.json()["sources"]
    assert sources, reply.json()
    for source in sources:
        assert source["document"] in DOCUMENTS and source["title"] == TITLES[source["document"]], source


def test_the_client_queries_answer_as_the_reference_citing_the_mounted_files(cluster, reference_answers):
    queries = list(QUERIES)
    with ThreadPoolExecutor(len(queries)) as pool:
        replies = list(pool.map(lambda iq: post(cluster.url, f"ref-{iq[0]}", iq[1]), enumerate(queries)))
    for query, reply in zip(queries, replies):
        assert reply.status_code == 200, reply.text[:300]
        assert spec.validate_reply(reply.json(), reply.json()["request_id"]) == []
        check_sources(reply)
        check_answer(reply, query, reference_answers)


def test_the_nodes_send_their_spans_where_the_otel_variables_say(cluster, receiver):
    reply = requests.post(f"{cluster.url}/query", json={"request_id": "traced-1", "query": "Is my kettle covered?"},
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
    # The trace crossed into every index shard's container: each one's /search server span is in it.
    shards = set(COMPOSE_TOPOLOGY.index_nodes())
    wait_until(lambda: {r["rag.node"] for r, s in receiver.spans() if s.trace_id == span.trace_id} >= shards, 30,
               "the index containers' spans of the request did not arrive", poll_s=0.2)


# A worker container serves (answers a forwarded request) within this many seconds of its /ready
# first answering 200: the gateway re-resolves `worker` every DISCOVERY_INTERVAL_S (2 s), probes a
# new member at once and the others every HEALTH_INTERVAL_S (0.5 s here), then one request's time
# on a busy 2-core machine.
JOIN_BOUND_S = 30.0


def container_ip(container: str) -> str:
    return docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container).stdout.strip()


def gateway_workers(url: str) -> dict[str, dict]:
    """The gateway's workers by name: a discovered one is its address."""
    return {str(w["node"]): w for w in requests.get(f"{url}/health", timeout=10).json().get("workers", [])}


def is_ready(ip: str) -> bool:
    try:
        return requests.get(f"http://{ip}:8000/ready", timeout=2).status_code == 200
    except requests.RequestException:
        return False


class Watched:
    """A worker container's exit code and whole log, kept by `docker wait` and `docker logs -f`, so
    they outlive the container compose removes on a scale-down."""

    def __init__(self, container: str, log_path):
        self.container = container
        self.log_path = log_path
        self._log = open(log_path, "w")
        self._wait = subprocess.Popen([DOCKER, "wait", container], stdout=subprocess.PIPE, text=True)
        self._logs = subprocess.Popen([DOCKER, "logs", "-f", container], stdout=self._log, stderr=subprocess.STDOUT)

    def exited(self, timeout_s: float = 60) -> tuple[int, str]:
        code = int(self._wait.communicate(timeout=timeout_s)[0].strip())
        self._logs.wait(timeout=timeout_s)
        self._log.close()
        return code, self.log_path.read_text(errors="replace")

    def forget(self) -> None:
        for process in (self._wait, self._logs):
            process.kill()
            process.wait(timeout=30)
        self._log.close()


def scale_workers(cluster: Compose, count: int, tmp_path) -> tuple[list[str], dict[str, tuple[int, str, str]]]:
    """`up --scale worker=count` (a scale-down stops the removed containers, each draining on its
    SIGTERM, before it returns): the containers it added, and each removed one's exit code, log and
    the address the gateway knew it by."""
    before = cluster.containers("worker")
    addresses = {c: f"{container_ip(c)}:8000" for c in before}
    watched = {c: Watched(c, tmp_path / f"worker-{c[:12]}.log") for c in before}
    cluster("up", "-d", "--no-build", "--no-deps", "--no-recreate", "--scale", f"worker={count}", "worker",
            timeout=400)
    after = cluster.containers("worker")
    removed = {c: (*watched.pop(c).exited(), addresses[c]) for c in before if c not in after}
    for watcher in watched.values():
        watcher.forget()
    return [c for c in after if c not in before], removed


def test_workers_scale_1_3_1_under_steady_load_and_every_request_is_answered(cluster, tmp_path):
    """`docker compose up --scale worker=N` while three clients send one request after another: each
    new worker serves within JOIN_BOUND_S of becoming ready, each removed one drains and exits 0,
    and every request is answered (200, or 503 with Retry-After and then 200 on its retry)."""
    cluster.wait_rotation(START_S)
    load = SteadyLoad(cluster.url, clients=3, prefix="scale", timeout_s=400).start()
    joins: dict[str, float] = {}
    drained: dict[str, tuple[int, str, str]] = {}
    try:
        wait_until(lambda: load.answered() >= 3, 300, "the load got no answers", poll_s=0.5)
        for count in (1, 3, 1):
            added, removed = scale_workers(cluster, count, tmp_path)
            drained.update(removed)
            # The gateway forgets the removed ones at its next lookup (before Docker can hand a
            # removed one's address to a new container).
            left = {address for _, _, address in removed.values()}
            wait_until(lambda gone=left: not gone & set(gateway_workers(cluster.url)), 30,
                       f"the gateway kept removed workers {left}", poll_s=0.2)
            names = {c: f"{container_ip(c)}:8000" for c in added}
            ready_at: dict[str, float] = {}

            def all_served(added=added, names=names, ready_at=ready_at) -> bool:
                """One look at each new worker: ready yet, in the rotation, sent a request; all sent one?"""
                workers = gateway_workers(cluster.url)
                for c in (c for c in added if c not in joins):
                    ip = names[c].split(":")[0]
                    if c not in ready_at and is_ready(ip):
                        ready_at[c] = time.monotonic()
                    seen = workers.get(names[c], {})
                    if seen.get("up"):  # in the rotation: its /ready said 200 to the gateway's probe
                        assert c in ready_at or is_ready(ip), f"worker {c[:12]} routed to before it was ready"
                        ready_at.setdefault(c, time.monotonic())
                    if seen.get("forwarded", 0) > 0:
                        joins[c] = time.monotonic() - ready_at[c]
                return all(c in joins for c in added)

            wait_until(all_served, START_S, lambda: f"new workers did not serve:\n{cluster.logs()}", poll_s=0.2)
            answered = load.answered()
            wait_until(lambda n=answered: load.answered() >= n + 3, 300, f"the load stalled at {count} workers",
                       poll_s=0.5)
    finally:
        outcomes = load.stop(timeout_s=450)
    lost = unanswered(outcomes)
    retried = sum(o.retried_503s for o in outcomes)
    print(f"\n[containers] scaling 2 -> 1 -> 3 -> 1 under load: {len(outcomes)} requests, "
          f"{len(outcomes) - len(lost)} answered 200, {retried} 503s with Retry-After retried")
    for c, seconds in joins.items():
        print(f"[containers] new worker {c[:12]} served {seconds:.1f} s after its /ready (bound {JOIN_BOUND_S:g} s)")
    for c, (code, log, _) in drained.items():
        at_exit = re.search(r"stopped \(in flight at exit: (\d+)\)", log)
        print(f"[containers] removed worker {c[:12]}: exit {code}, in flight at exit "
              f"{at_exit.group(1) if at_exit else '?'}, served {log.count('request done')} requests")
    assert not lost, [(o.request_id, o.status, o.detail) for o in lost[:5]]
    assert len(joins) == 2 and all(seconds < JOIN_BOUND_S for seconds in joins.values()), joins
    assert len(drained) == 3
    for c, (code, log, _) in drained.items():
        assert code == 0 and "stopped (in flight at exit: 0)" in log, (c, code, log[-2000:])
    cluster("up", "-d", "--no-build", "--no-deps", "--no-recreate", "--scale", "worker=2", "worker", timeout=400)


def test_a_configuration_error_is_not_restarted_forever(built, tmp_path_factory):
    """A node without CLUSTER_TOKEN (it listens on 0.0.0.0) exits 2 naming the variable; compose's
    restart policy gives up after its 3 retries."""
    compose = Compose(f"ragbad{os.getpid()}", tmp_path_factory.mktemp("bad"), free_ports(1)[0])
    compose.override.write_text(yaml.safe_dump({"services": {"worker": {"environment": {"CLUSTER_TOKEN": ""}}}}))
    try:
        compose("up", "-d", "--no-deps", "--scale", "worker=1", "worker", timeout=120)
        container = compose.container("worker")
        inspected: dict = {}

        def given_up() -> bool:
            inspected.update(json.loads(docker("inspect", container).stdout)[0])
            return inspected["State"]["Status"] == "exited" and inspected["RestartCount"] == 3

        # Each start imports the node: slow on a busy machine.
        wait_until(given_up, 300, "the worker was not restarted 3 times", poll_s=1)
        state = inspected["State"]
        assert (state["Status"], state["ExitCode"], inspected["RestartCount"]) == ("exited", 2, 3), state
        # Nothing restarts it again: Docker's policy stops at its 3 retries (no waiting to see it stay down).
        assert inspected["HostConfig"]["RestartPolicy"] == {"Name": "on-failure", "MaximumRetryCount": 3}
        again = json.loads(docker("inspect", container).stdout)[0]
        assert (again["State"]["Status"], again["State"]["StartedAt"]) == ("exited", state["StartedAt"])
        assert "CLUSTER_TOKEN='' is not valid" in docker("logs", container).stderr
    finally:
        compose("down", "-v", "--timeout", "5", timeout=120, check=False)


def test_killing_a_worker_then_an_index_shard_under_load_loses_no_request(cluster, reference_answers):
    cluster.wait_rotation(START_S)
    results: list = []
    lock, stop = threading.Lock(), threading.Event()
    queries = list(spec.REFERENCE_QUERIES)

    def client(n: int) -> None:
        for i in range(60):  # bounded: at most 60 requests per client
            if stop.is_set():
                return
            query = queries[(n + i) % len(queries)]
            try:
                response = post(cluster.url, f"kill-{n}-{i}-{uuid.uuid4().hex[:6]}", query)
            except requests.RequestException as exc:  # an accepted request that got no answer
                response = exc
            with lock:
                results.append((query, response))

    def answered(at_least: int, timeout_s: float = 400) -> None:
        wait_until(lambda: len(results) >= at_least, timeout_s,
                   lambda: f"only {len(results)} answers:\n{cluster.logs()}", poll_s=0.2)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        answered(4)
        worker = cluster.container("worker")
        docker("kill", worker)  # a worker
        after_worker = len(results)
        answered(after_worker + 4)
        last_shard = COMPOSE_TOPOLOGY.index_names()[-1]
        docker("kill", cluster.container(last_shard))  # an index shard, its only replica here
        # Back at once, as a restarted pod would be: the searches in flight retry until it answers
        # (a shard still down at the request's deadline would be a clear 503).
        docker("start", cluster.container(last_shard))
        answered(len(results) + 4)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=450)
        # A killed container stays down (Docker restarts only what exits by itself): bring it back.
        docker("start", worker)
    lost = [(q, r) for q, r in results if isinstance(r, Exception)]
    assert not lost, lost[:3]
    for query, response in results:
        check_answer(response, query, reference_answers)
    statuses = [r.status_code for _, r in results]
    assert statuses[after_worker:].count(200) >= 1, statuses  # the other workers took over
    print(f"\n[containers] under kills: {statuses.count(200)} answered, {statuses.count(503)} clear 503")


def test_down_drains_the_requests_in_flight(cluster, reference_answers, tmp_path):
    cluster.wait_rotation(START_S)  # the killed worker back in the rotation
    queries = [spec.REFERENCE_QUERIES[i % 8] for i in range(16)]
    with ThreadPoolExecutor(len(queries)) as pool:
        futures = [pool.submit(post, cluster.url, f"drain-{i}-{uuid.uuid4().hex[:6]}", q) for i, q in enumerate(queries)]
        seen: list[int] = []

        def in_flight() -> int:
            seen.append(requests.get(f"{cluster.url}/health", timeout=5).json()["gateway"]["in_flight"])
            return seen[-1]

        wait_until(in_flight, 60, "no request was in flight", poll_s=0.05)
        running = cluster("ps", "-q").stdout.split()  # every node container (the data service has exited)
        logs = {c: Watched(c, tmp_path / f"{c[:12]}.log") for c in running}  # kept past `down`'s removal
        # Every container's exit, as Docker reports it while `down` stops them.
        events = subprocess.Popen([DOCKER, "events", "--filter", f"label=com.docker.compose.project={cluster.name}",
                                   "--filter", "event=die", "--format",
                                   "{{.Actor.Attributes.name}} {{.Actor.Attributes.exitCode}}"],
                                  stdout=subprocess.PIPE, text=True)
        started = time.monotonic()
        try:
            cluster("down", timeout=400)
        finally:
            events.terminate()
        down_s = time.monotonic() - started
        exits = dict(line.split() for line in events.communicate(timeout=30)[0].splitlines())
        replies = [f.result() for f in futures]
    for query, reply in zip(queries, replies):
        check_answer(reply, query, reference_answers)
    # Every node exited by itself on its SIGTERM (0), none was killed at the end of its stop grace.
    nodes = {name: code for name, code in exits.items() if re.search(r"-(node\d+|worker)-", name)}
    ended = {c: watched.exited() for c, watched in logs.items()}
    killed = {c[:12]: log[-3000:] for c, (code, log) in ended.items() if code != 0}
    assert len(nodes) == len(running) >= 4 and set(nodes.values()) == {"0"}, (exits, killed)
    print(f"\n[containers] down with {seen[-1]} in flight: {down_s:.0f} s")
