"""A worker with two torch threads holds no OpenMP workers once its requests are answered: each
stage's thread hands its team back when it waits (pipeline.openmp_workers), so the team of the stage
that runs is the only one and libgomp lets its workers spin (docs/performance.md, section 29). Without
that, every stage that ran keeps a docked worker for good: a node's thread count grows by one a stage."""
from __future__ import annotations

import os
import sys

import pytest

from tests.helpers import post_query, start_cluster, uid, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux only")]


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.mark.timeout(300)
def test_a_worker_hands_back_its_openmp_workers_between_requests(support_data, tmp_path_factory):
    cluster = start_cluster(support_data, tmp_path_factory.mktemp("openmp-logs"), TORCH_THREADS="2")
    try:
        # Node 1: a worker only (node 0's gateway starts a relay thread to node 1 at its first request).
        pid = cluster.procs[1].pid
        # Read once serving: the start-up thread that loaded and warmed the models, and its team, may
        # not have ended yet, so this is an upper bound of the idle count.
        idle = threads(pid)
        for i in range(4):  # two to node 1: the gateway alternates
            assert post_query(cluster, uid(f"openmp-{i}")).status_code == 200
        wait_until(lambda: threads(pid) <= idle, 20,
                   lambda: f"node 1 holds {threads(pid)} threads, {idle} when it started serving")
    finally:
        cluster.stop()
