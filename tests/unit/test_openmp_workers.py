"""pipeline.openmp_workers: a thread hands back its OpenMP workers and keeps its thread count and its
bits, in torch's runtime and in faiss's; without torch loaded it does nothing (and loads nothing). In a fresh
interpreter: the team a thread holds is process state."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The thread count of this process, and the wait for it to come back down: both scripts' first lines.
THREADS = r"""
import json, os, sys, threading, time

def threads():
    return len(os.listdir("/proc/self/task"))

def settled(expected):  # a worker that was told to end may take a moment to leave /proc
    deadline = time.monotonic() + 10
    while threads() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return threads()

"""

SCRIPT = THREADS + r"""
from pipeline.openmp_workers import hand_back_openmp_workers

hand_back_openmp_workers()
out = {"torch_loaded_by_it": "torch" in sys.modules}
import torch
torch.set_num_threads(2)

def stage():
    a = torch.randn(512, 512, generator=torch.Generator().manual_seed(0))
    out["alone"] = threads()
    first = a @ a
    out["with_team"] = threads()
    hand_back_openmp_workers()
    out["after"] = settled(out["alone"])
    out["thread_count"] = torch.get_num_threads()
    second = a @ a
    out["team_again"] = threads()
    out["same_bits"] = torch.equal(first, second)
    hand_back_openmp_workers()
    out["after_again"] = settled(out["alone"])

thread = threading.Thread(target=stage)
thread.start()
thread.join()
print(json.dumps(out))
"""


def run_fresh(script: str) -> dict:
    """What `script` printed last, as JSON, run in a fresh interpreter at two OpenMP threads."""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libgomp and /proc/self/task: Linux only")
def test_a_thread_hands_back_its_openmp_workers_and_keeps_its_thread_count_and_bits():
    out = run_fresh(SCRIPT)
    assert out["torch_loaded_by_it"] is False
    assert out["with_team"] == out["alone"] + 1, out  # the premise: a product at 2 threads starts a worker
    assert out["after"] == out["alone"], out
    assert out["thread_count"] == 2
    assert out["team_again"] == out["alone"] + 1 and out["same_bits"] is True, out
    assert out["after_again"] == out["alone"], out


FAISS_SCRIPT = THREADS + r"""
import faiss, numpy as np
from pipeline.openmp_workers import hand_back_openmp_workers

out = {}
vectors = np.random.default_rng(0).random((4000, 32), dtype=np.float32)
index = faiss.IndexIVFFlat(faiss.IndexFlatL2(32), 32, 16)
index.train(vectors)
index.add(vectors)
index.nprobe = 16

def search():
    faiss.omp_set_num_threads(2)
    out["alone"] = threads()
    first = index.search(vectors[:64], 10)
    out["with_team"] = threads()
    hand_back_openmp_workers()
    out["after"] = settled(out["alone"])
    out["thread_count"] = faiss.omp_get_max_threads()
    second = index.search(vectors[:64], 10)
    out["same_results"] = all(np.array_equal(a, b) for a, b in zip(first, second))

thread = threading.Thread(target=search)
thread.start()
thread.join()
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libgomp and /proc/self/task: Linux only")
def test_a_thread_hands_back_its_faiss_openmp_workers():
    """faiss's wheel carries its own libgomp: the index node's search thread hands that team back too."""
    out = run_fresh(FAISS_SCRIPT)
    assert out["with_team"] == out["alone"] + 1, out  # the premise: a search of 64 vectors at 2 threads starts a worker
    assert out["after"] == out["alone"], out
    assert out["thread_count"] == 2 and out["same_results"] is True, out
