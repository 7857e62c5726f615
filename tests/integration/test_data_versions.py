"""Data versions with real processes: a worker refuses an index built by another embedder, a node
refuses a build without its manifest, and a builder SIGKILLed anywhere leaves no partial version."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import faiss
import pytest

from builders.manifest import file_sha256
from pipeline.config import REPO_ROOT
from pipeline.data_version import (
    MANIFEST_NAME,
    DataVersionError,
    EmbedderInfo,
    content_hash,
    load_version,
    read_manifest,
    write_manifest,
)
from tests.helpers import TEST_ENV
from tests.support import forked_nodes
from tools.local import NodeProcess, free_ports

pytestmark = pytest.mark.slow


def copy_version(source: Path, target: Path) -> Path:
    """A copy of a built version under another name, its manifest renamed with it."""
    shutil.copytree(source, target)
    manifest = read_manifest(target)
    write_manifest(target, dataclasses.replace(manifest, version=target.name))
    return target


def node_env(version_dir: Path, node: int, **extra: str) -> dict[str, str]:
    ports = free_ports(3)
    return {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", **TEST_ENV,
            **({"STANDIN_HOME": os.environ["STANDIN_HOME"]} if os.environ.get("STANDIN_HOME") else {}),
            "FAISS_INDEX_PATH": str(version_dir / "faiss_index.bin"), "DOCUMENTS_DIR": str(version_dir / "documents"),
            **{f"NODE_{i}_IP": f"127.0.0.1:{port}" for i, port in enumerate(ports)}, "NODE_NUMBER": str(node),
            "TORCH_THREADS": "1", **extra}


def run_node(env: dict[str, str], timeout_s: float = 240) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-m", "services.node"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"the node did not exit:\n{output[-3000:]}")
    return proc.returncode, output


def test_a_worker_refuses_an_index_built_by_another_embedder_naming_both(support_data, tmp_path):
    version = copy_version(support_data.index_path.parent, tmp_path / "built-by-hub")
    manifest = read_manifest(version)
    real = EmbedderInfo(model=manifest.embedder.model, source="hub", revision="5c38ec7c405ec4b44b94cc5a9bb96e735b38267a",
                        precision="float32", dim=768)
    write_manifest(version, dataclasses.replace(manifest, embedder=real))
    code, output = run_node(node_env(version, 1))
    assert code == 2, output[-3000:]
    line = next(line for line in output.splitlines() if "was built by the embedder" in line)
    assert "BAAI/bge-base-en-v1.5@5c38ec7c405e (hub, float32, 768-d)" in line
    assert "this worker's embedder is BAAI/bge-base-en-v1.5@" in line and "(standin:tiny, float32, 768-d)" in line
    assert "weights from hub vs standin:tiny" in line


@pytest.mark.parametrize("node", [1, 2])
def test_a_node_refuses_a_build_without_its_manifest(support_data, tmp_path, node):
    version = copy_version(support_data.index_path.parent, tmp_path / "unfinished")
    (version / MANIFEST_NAME).unlink()
    code, output = run_node(node_env(version, node))
    assert code == 2, output[-3000:]
    assert f"{version} holds no {MANIFEST_NAME}: not a complete data build" in output


# ---------------------------------------------------------------- a builder killed anywhere


def build(args: list[str], log: Path) -> NodeProcess:
    """`python -m builders.data ARGS`, its output in `log`, forked from the fork server as the tests'
    nodes are (tests/support/forked_nodes.py: the same module in its own process, without
    re-importing torch): SIGKILL ends it wherever it is, as it would a process started afresh."""
    return forked_nodes.launch([sys.executable, "-m", "builders.data", *args, "--no-progress"],
                               {**os.environ, **TEST_ENV}, REPO_ROOT, log)


def assert_one_complete_version_or_none(version_dir: Path) -> str | None:
    """The invariant a kill must keep: a manifest only beside the very files it describes. Returns
    what identifies the version (its documents' and index files' hashes), or None for no version."""
    try:
        manifest = load_version(version_dir)
    except DataVersionError:
        return None
    assert content_hash(version_dir / "documents" / "documents.db") == manifest.content_hash
    assert {name: file_sha256(version_dir / name) for name in manifest.index_files} == manifest.index_sha256
    ntotal = sum(faiss.read_index(str(version_dir / name)).ntotal for name in manifest.index_files)
    assert ntotal == manifest.documents
    return f"{manifest.content_hash} {sorted(manifest.index_sha256.values())}"


def kill_when(proc: NodeProcess, condition, timeout_s: float = 300) -> None:
    """SIGKILL `proc` as soon as `condition()` holds (polled every 2 ms), or let it finish."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and not condition():
        assert time.monotonic() < deadline, "the build neither finished nor reached the point"
        time.sleep(0.002)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_builder_killed_at_any_point_leaves_the_previous_version_whole_or_none(tmp_path):
    target, logs = tmp_path / "v1", tmp_path / "logs"
    logs.mkdir()
    first = build(["build", "--out", str(target), "--kind", "course", "--docs", "20000", "--seed", "1", "--accept-low-recall"], logs / "first")
    assert first.wait(timeout=300) == 0, (logs / "first").read_text()[-3000:]
    previous = assert_one_complete_version_or_none(target)
    assert previous is not None
    points = {  # a forced rebuild: writing the database, writing the index, between the renames
        "database": lambda: (target / "documents" / ".documents.db.partial").exists(),
        "index": lambda: (target / ".faiss_index.bin.partial").exists(),
        "renames": lambda: not (target / MANIFEST_NAME).exists(),
    }
    outcomes = {}
    for point, reached in points.items():
        proc = build(["build", "--out", str(target), "--kind", "course", "--docs", "20000", "--seed", "2", "--force",
                      "--accept-low-recall"],
                     logs / point)
        kill_when(proc, reached)
        outcomes[point] = assert_one_complete_version_or_none(target)
    assert outcomes["database"] in (previous, None) and outcomes["index"] in (previous, None)
    # The next attempt completes, without --force: a directory without a manifest is an interrupted build.
    again = build(["build", "--out", str(target), "--kind", "course", "--docs", "20000", "--seed", "2", "--accept-low-recall",
                   *(["--force"] if (target / MANIFEST_NAME).exists() else [])], logs / "again")
    assert again.wait(timeout=300) == 0, (logs / "again").read_text()[-3000:]
    rebuilt = assert_one_complete_version_or_none(target)
    assert rebuilt is not None and rebuilt != previous
    assert read_manifest(target).index["seed"] == 2


@pytest.mark.parametrize("extra_s", [0.0, 0.05])
def test_an_update_killed_while_it_writes_leaves_no_partial_version_and_the_next_attempt_completes(
        support_data, tmp_path, extra_s):
    source = copy_version(support_data.index_path.parent, tmp_path / "v1")
    changes = tmp_path / "changes.jsonl"
    changes.write_text("\n".join(json.dumps(entry) for entry in [
        {"doc_id": 3, "delete": True},
        {"doc_id": 900001, "title": "Gift cards", "content": "Gift cards are redeemed at checkout.", "category": "billing"},
    ]) + "\n")
    target = tmp_path / "v2"
    args = ["update", "--from", str(source), "--out", str(target), "--changes", str(changes)]
    proc = build(args, tmp_path / "killed.log")

    def writing() -> bool:
        if target.exists() and any(target.rglob("*")):
            time.sleep(extra_s)
            return True
        return False

    kill_when(proc, writing)
    # Killed before its manifest: no version; killed after it (a slow machine lets the kill land that
    # late) or never: the whole version. Never a manifest beside files it does not describe.
    left = assert_one_complete_version_or_none(target)  # asserts the manifest describes its files
    # The next attempt completes: without --force when the kill left no version (what it left is no
    # version, not an output in the way).
    done = build([*args, *(["--force"] if left is not None else [])], tmp_path / "done.log")
    assert done.wait(timeout=300) == 0, (tmp_path / "done.log").read_text()[-3000:]
    manifest = read_manifest(target)
    assert assert_one_complete_version_or_none(target) is not None
    assert (manifest.parent, manifest.changes) == ("v1", {"added": 1, "replaced": 0, "deleted": 1})
