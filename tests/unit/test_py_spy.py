"""profiling.lib.py_spy: a node's process found among its launcher's children, py-spy's raw stacks read per thread,
and nothing run where py-spy is missing."""
import os
import subprocess
import sys

import pytest

from profiling.lib import py_spy

RAW = """thread (0x7f01): continuous-generate;_bootstrap (threading.py:1);run (engine.py:2);decode (runner.py:3) 40
thread (0x7f01): continuous-generate;_bootstrap (threading.py:1);run (engine.py:2);choose (sampling.py:4) 25
thread (0x7f02): waitress-0;_bootstrap (threading.py:1);handler_thread (task.py:5);submit (batching.py:6) 7
thread (0x7f03): waitress-1;_bootstrap (threading.py:1);handler_thread (task.py:5);submit (batching.py:6) 5
not a stack line
"""


def test_the_raw_stacks_are_counted_per_thread_with_a_pools_threads_as_one():
    tops = py_spy.thread_tops(RAW)
    assert list(tops) == ["continuous-generate", "waitress"]
    assert tops["continuous-generate"] == {"samples": 65, "top": {"_bootstrap;run;decode": 40, "_bootstrap;run;choose": 25}}
    assert tops["waitress"] == {"samples": 12, "top": {"_bootstrap;handler_thread;submit": 12}}


def test_nothing_recorded_reads_as_none(tmp_path):
    assert py_spy.read_tops(None) is None
    (tmp_path / "empty.txt").write_text("")
    assert py_spy.read_tops(tmp_path / "empty.txt") is None


def test_without_py_spy_or_a_process_the_block_runs_unrecorded(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no py-spy there
    with py_spy.gil_recording(os.getpid(), tmp_path / "spy.txt") as recorded:
        assert recorded is None
    with py_spy.gil_recording(None, tmp_path / "spy.txt") as recorded:
        assert recorded is None


@pytest.mark.slow  # starts a process with a node's environment
def test_a_nodes_process_is_found_among_its_launchers_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env={**os.environ, "NODE_NUMBER": "1"})
    try:
        assert py_spy.node_pid(os.getpid(), 1) == child.pid
        assert py_spy.node_pid(os.getpid(), 2) is None
    finally:
        child.kill()
        child.wait()
