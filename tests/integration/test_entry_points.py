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


def test_node_whose_request_timeout_exceeds_node_1s_internal_cap_exits_2_naming_both(course_data):
    # Node 1 refuses an /internal/answer timeout_s above its cap: such a node would start and then
    # fail every forward. It must refuse to start instead, with one line naming both limits.
    from services.local_cluster import free_ports
    from tests.helpers import TEST_ENV, data_env
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", **TEST_ENV, **data_env(course_data),
           "NODE_NUMBER": "1", "NODE_1_IP": f"127.0.0.1:{free_ports(1)[0]}", "REQUEST_TIMEOUT_S": "4000"}
    proc = subprocess.Popen([sys.executable, "-m", "services.node"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate(timeout=30)
        pytest.fail(f"the node started with REQUEST_TIMEOUT_S=4000 instead of refusing:\n{stderr[-2000:]}")
    assert proc.returncode == 2, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("config error: REQUEST_TIMEOUT_S='4000' is not valid"), last
    assert "MAX_INTERNAL_TIMEOUT_S" in last and "Traceback" not in stderr
