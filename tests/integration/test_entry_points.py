"""Entry points started as processes: a bad setting is one line, not a traceback."""
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import REPO_ROOT

pytestmark = pytest.mark.slow


def test_entry_point_prints_one_line_not_a_traceback(tmp_path: Path):
    env = {"PATH": "/usr/bin:/bin", "ONLY_CPU": "maybe", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pipeline.reference"], env=env, capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "config error: ONLY_CPU='maybe' is not valid: expected true or false (also 1/0, yes/no, on/off)")
    assert "Traceback" not in proc.stderr
