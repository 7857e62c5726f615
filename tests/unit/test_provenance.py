"""profiling/lib/provenance.py's git_commit: HEAD's commit and whether tracked files differ from it, and
'unknown' outside git. It runs git (processes): slow. The tools' own tests record
tests.helpers.TOOL_COMMIT instead."""
from __future__ import annotations

import subprocess

import pytest

from pipeline.config import REPO_ROOT
from profiling.lib import provenance

pytestmark = pytest.mark.slow  # runs git


def test_the_tools_commit_is_heads_and_says_whether_tracked_files_differ():
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout

    record = provenance.git_commit()
    assert record == {"commit": git("rev-parse", "HEAD").strip(),
                      "dirty": bool(git("status", "--porcelain", "--untracked-files=no").strip())}
    assert len(record["commit"]) == 40 and int(record["commit"], 16) >= 0


def test_outside_git_the_commit_is_unknown(tmp_path):
    assert provenance.git_commit(tmp_path) == {"commit": provenance.UNKNOWN, "dirty": None}
