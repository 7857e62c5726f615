"""The image and the compose topology, for real: deploy/Dockerfile builds from a clean checkout
(the base made offline by deploy/make-base-image.sh, torch from this machine's wheel folder),
then deploy/compose.yaml's five nodes come up with tiny stand-ins, answer the eight client
queries as the reference pipeline does, lose no accepted request when a worker and then an index
shard are killed under load, and drain on `down`. A configuration error is not restarted forever.

Needs a Docker daemon (./run.sh setup starts one as root: deploy/install-container-tools.sh),
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
from pipeline.config import REPO_ROOT, Settings
from tests.support.containers import (
    BASE_IMAGE,
    DOCKER,
    IMAGE,
    START_S,
    Compose,
    WheelServer,
    build,
    clean_checkout,
    docker,
    local_wheel_folder,
    why_not,
)
from tools.local import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    problem = why_not()
    if problem:
        pytest.skip(problem)
    started = time.monotonic()
    made = subprocess.run([str(REPO_ROOT / "deploy" / "make-base-image.sh"), BASE_IMAGE], capture_output=True,
                          text=True, timeout=1200, env={**os.environ, "DOCKER": DOCKER})
    assert made.returncode == 0, made.stderr[-3000:]
    base_s = time.monotonic() - started
    folder = local_wheel_folder()
    wheels = WheelServer(folder) if folder else None
    context = clean_checkout(tmp_path_factory.mktemp("checkout"))
    try:
        build_s, log = build(context, wheels)
        print(f"\n[containers] base image {base_s:.0f} s, image build {build_s:.0f} s")
        yield {"context": context, "wheels": wheels, "log": log}
    finally:
        if wheels:
            wheels.close()


def test_the_image_runs_as_a_numeric_user_with_the_kernel_and_no_compiler(built):
    config = json.loads(docker("image", "inspect", IMAGE).stdout)[0]["Config"]
    assert config["User"] == "10001:10001"
    assert config["Healthcheck"]["Test"][:2] == ["CMD", "python"]
    probe = ("import shutil; from pipeline.kernels.fused_int8 import fused_ops; "
             "assert fused_ops() is not None, 'kernel not built'; "
             "assert not any(map(shutil.which, ('g++', 'gcc', 'c++'))), 'a compiler is left'; print('ok')")
    run = docker("run", "--rm", "--network", "none", "--entrypoint", "python", IMAGE, "-c", probe)
    assert run.stdout.strip() == "ok", run.stderr


def test_a_code_change_rebuilds_neither_torch_nor_the_compiler(built):
    changed = built["context"] / "services" / "node.py"
    changed.write_text(changed.read_text() + "\n# a code change\n")
    seconds, log = build(built["context"], built["wheels"])
    steps = {n: name for n, name in re.findall(r"^#(\d+) \[[^\]]+\] (.*)$", log, flags=re.M)}
    cached = set(re.findall(r"^#(\d+) CACHED$", log, flags=re.M))
    for step in ("torch==2.13.0", "install -r /tmp/requirements.txt", "install -y --no-install-recommends g++",
                 "python -m pipeline.kernels.fused_int8"):
        numbers = [n for n, name in steps.items() if step in name]
        assert numbers and set(numbers) <= cached, f"{step!r} ran again:\n{log[-4000:]}"
    assert set(steps) - cached, "the code change rebuilt nothing"
    print(f"\n[containers] rebuild after a code change {seconds:.0f} s")


# ---------------------------------------------------------------- compose

@pytest.fixture(scope="module")
def cluster(built, tmp_path_factory):
    compose = Compose(f"ragtest{os.getpid()}", tmp_path_factory.mktemp("compose"), free_ports(1)[0])
    started = time.monotonic()
    try:
        compose("up", "-d", "--no-build", timeout=START_S)
        health = compose.wait_rotation(START_S)
        print(f"\n[containers] compose up to every worker in rotation: {time.monotonic() - started:.0f} s")
        assert len(health["workers"]) == 3 and health["total_nodes"] == 5
        yield compose
    finally:
        compose("down", "-v", "--timeout", "10", timeout=300, check=False)


@pytest.fixture(scope="module")
def reference_answers(cluster, tmp_path_factory):
    """The reference pipeline over what the one-shot `data` service wrote (data and stand-ins)."""
    from pipeline.reference import ReferencePipeline
    out = tmp_path_factory.mktemp("volumes")
    data = cluster.container("data")
    docker("cp", f"{data}:/data", str(out / "data"))
    docker("cp", f"{data}:/standins", str(out / "standins"))
    settings = Settings.from_env({
        "MODEL_SOURCE": "standin", "STANDIN_PROFILE": "tiny", "STANDIN_HOME": str(out / "standins" / "home"),
        "PRECISION": "float32", "ONLY_CPU": "true", "TOTAL_NODES": "5", "INDEX_NODES": "2,3", "INDEX_SHARDS": "2",
        "FAISS_INDEX_PATH": str(out / "data" / "faiss_index.bin"), "DOCUMENTS_DIR": str(out / "data" / "documents")})
    reference = ReferencePipeline.from_settings(settings)
    return {query: reference.answer(query, "") for query in spec.REFERENCE_QUERIES}


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


def test_the_eight_client_queries_answer_as_the_reference(cluster, reference_answers):
    queries = list(spec.REFERENCE_QUERIES)
    with ThreadPoolExecutor(len(queries)) as pool:
        replies = list(pool.map(lambda iq: post(cluster.url, f"ref-{iq[0]}", iq[1]), enumerate(queries)))
    for query, reply in zip(queries, replies):
        assert reply.status_code == 200, reply.text[:300]
        assert spec.validate_reply(reply.json(), reply.json()["request_id"]) == []
        check_answer(reply, query, reference_answers)


def test_a_configuration_error_is_not_restarted_forever(built, tmp_path_factory):
    """A node without CLUSTER_TOKEN (it listens on 0.0.0.0) exits 2 naming the variable; compose's
    restart policy gives up after its 3 retries."""
    compose = Compose(f"ragbad{os.getpid()}", tmp_path_factory.mktemp("bad"), free_ports(1)[0])
    compose.override.write_text(yaml.safe_dump({"services": {"node1": {"environment": {"CLUSTER_TOKEN": ""}}}}))
    try:
        compose("up", "-d", "--no-deps", "node1", timeout=120)
        container = compose.container("node1")
        deadline, state = time.monotonic() + 300, {}  # each start imports the node: slow on a busy machine
        while time.monotonic() < deadline:
            inspected = json.loads(docker("inspect", container).stdout)[0]
            state = {**inspected["State"], "RestartCount": inspected["RestartCount"]}
            if state["Status"] == "exited" and state["RestartCount"] == 3:
                break
            time.sleep(1)
        assert (state["Status"], state["ExitCode"], state["RestartCount"]) == ("exited", 2, 3), state
        time.sleep(3)  # nothing restarts it again
        assert json.loads(docker("inspect", container).stdout)[0]["State"]["Status"] == "exited"
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
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(results) < at_least:
            time.sleep(0.2)
        assert len(results) >= at_least, f"only {len(results)} answers:\n{cluster.logs()}"

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        answered(4)
        docker("kill", cluster.container("node1"))  # a worker
        after_worker = len(results)
        answered(after_worker + 4)
        docker("kill", cluster.container("node3"))  # index shard 1, its only replica here
        # Back at once, as a restarted pod would be: the searches in flight retry until it answers
        # (a shard still down at the request's deadline would be a clear 503).
        docker("start", cluster.container("node3"))
        answered(len(results) + 4)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=450)
        # A killed container stays down (Docker restarts only what exits by itself): bring it back.
        docker("start", cluster.container("node1"))
    lost = [(q, r) for q, r in results if isinstance(r, Exception)]
    assert not lost, lost[:3]
    for query, response in results:
        check_answer(response, query, reference_answers)
    statuses = [r.status_code for _, r in results]
    assert statuses[after_worker:].count(200) >= 1, statuses  # the other workers took over
    print(f"\n[containers] under kills: {statuses.count(200)} answered, {statuses.count(503)} clear 503")


def test_down_drains_the_requests_in_flight(cluster, reference_answers):
    cluster.wait_rotation(START_S)  # the killed worker back in the rotation
    queries = [spec.REFERENCE_QUERIES[i % 8] for i in range(16)]
    with ThreadPoolExecutor(len(queries)) as pool:
        futures = [pool.submit(post, cluster.url, f"drain-{i}-{uuid.uuid4().hex[:6]}", q) for i, q in enumerate(queries)]
        deadline, seen = time.monotonic() + 60, 0
        while time.monotonic() < deadline and not seen:
            seen = requests.get(f"{cluster.url}/health", timeout=5).json()["gateway"]["in_flight"]
        assert seen, "no request was in flight"
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
    nodes = {name: code for name, code in exits.items() if re.search(r"-node\d+-", name)}
    assert len(nodes) == 5 and set(nodes.values()) == {"0"}, exits
    print(f"\n[containers] down with {seen} in flight: {down_s:.0f} s")
