"""`./run.sh demo` end to end: builds its data, starts three nodes, answers the eight queries."""
import os
import re
import subprocess

import pytest

from pipeline import spec
from pipeline.config import REPO_ROOT
from tools.local import free_ports

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_run_sh_demo_answers_the_eight_queries(tmp_path):
    ports = free_ports(3)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NODE_", "FAISS_", "DOCUMENTS_"))}
    env.update({"DEMO_DIR": str(tmp_path / "demo"), "DEMO_DOCS": "300", "MODEL_SOURCE": "standin",
                "STANDIN_PROFILE": "tiny", "HF_HUB_OFFLINE": "1", "DEMO_INTERVAL_S": "0.2"})
    env.update({f"NODE_{i}_IP": f"127.0.0.1:{p}" for i, p in enumerate(ports)})
    proc = subprocess.run(["bash", str(REPO_ROOT / "run.sh"), "demo"], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for query in spec.REFERENCE_QUERIES:
        assert f"Q: {query}" in out
    answers = re.findall(r"sentiment=(.+?) is_toxic=(true|false)", out)
    assert len(answers) == 8
    assert all(sentiment in spec.SENTIMENTS for sentiment, _ in answers)
    assert "summary: sent 8, succeeded 8, failed 0" in out
    assert (tmp_path / "demo" / "faiss_index.bin").is_file()
