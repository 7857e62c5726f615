"""The data builder's command line, run as a process."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from pipeline.config import REPO_ROOT as ROOT
from pipeline.vector_index import VectorIndex
from tests.helpers import leftovers

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------- CLI


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "builders.data", "build", *args, "--no-progress"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_course_build_and_refusal(tmp_path):
    args = ["--out", str(tmp_path), "--kind", "course", "--docs", "400", "--nprobe", "4", "--accept-low-recall"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert "built course: 400 documents" in first.stdout
    index = VectorIndex.load(tmp_path / "faiss_index.bin", nprobe=None)
    assert (index.ntotal, index.dim, index.nprobe) == (400, 768, 4)

    refused = run_cli(*args)
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0 and "--force" in refused.stderr

    forced = run_cli(*args, "--seed", "1", "--force")
    assert forced.returncode == 0, forced.stderr
    assert VectorIndex.load(tmp_path / "faiss_index.bin").ntotal == 400


def test_cli_rejects_bad_nlist(tmp_path):
    result = run_cli("--out", str(tmp_path), "--kind", "course", "--docs", "10", "--nlist", "50")
    assert result.returncode == 2 and "--nlist" in result.stderr
    assert leftovers(tmp_path) == []


def test_cli_build_under_the_recall_floor_fails_naming_the_figure(tmp_path):
    low = run_cli("--out", str(tmp_path / "v1"), "--kind", "course", "--docs", "2000", "--nprobe", "1",
                  "--min-recall", "0.99", "--recall-queries", "100")
    assert low.returncode == 2
    assert re.search(r"error: recall@10 0\.\d+ is under the floor 0\.99 .*nprobe 1", low.stderr), low.stderr
    assert not (tmp_path / "v1" / "manifest.json").exists()
    tuned = run_cli("--out", str(tmp_path / "v1"), "--kind", "course", "--docs", "2000", "--nprobe", "1",
                    "--min-recall", "0.99", "--recall-queries", "100", "--tune")
    assert tuned.returncode == 0, tuned.stderr
    recall = json.loads((tmp_path / "v1" / "manifest.json").read_text())["index"]["recall"]
    assert recall["overall"] >= 0.99 and recall["params"]["nprobe"] > 1
