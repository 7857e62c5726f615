"""tests/conftest.py's guard (tests/helpers.py's no_processes): a test not marked slow that starts a
process fails, naming itself and the command, by every way Python starts one; a slow test is left alone.

The commands tried are harmless should the guard let them through (`true`, a child that exits at
once), and then the test fails: DID NOT RAISE. Also the groups the two xdist workers run the tests in,
and the torch threads each worker gets."""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import threading

import pytest

from tests.conftest import _unless_slow
from tests.helpers import no_processes


class Item:
    """What the guard reads of a pytest.Item: its id and whether it is marked slow."""

    def __init__(self, nodeid: str, slow: bool):
        self.nodeid, self.slow = nodeid, slow

    def get_closest_marker(self, name: str):
        return pytest.mark.slow.mark if self.slow and name == "slow" else None


FAST, SLOW = Item("tests/unit/test_x.py::test_fast", slow=False), Item("tests/unit/test_x.py::test_slow", slow=True)


def reap(pid: int) -> None:
    os.waitpid(pid, 0)


def forks() -> None:
    pid = os.fork()
    if pid == 0:  # only if the guard failed: the child leaves at once
        os._exit(0)
    reap(pid)


def spawns() -> None:
    reap(os.posix_spawn("/bin/true", ["true", "spawned"], dict(os.environ)))


def spawns_on_path() -> None:
    reap(os.posix_spawnp("true", ["true", "spawned"], dict(os.environ)))


def starts_a_multiprocessing_child() -> None:
    child = multiprocessing.get_context("fork").Process(target=int, name="mp-child")
    child.start()
    child.join()


@pytest.mark.parametrize("start, named", [
    (lambda: subprocess.run(["true", "--from-run"]), "true --from-run"),
    (lambda: subprocess.check_output("true shell", shell=True), "true shell"),
    (lambda: subprocess.Popen(["true", "popen"]).wait(), "true popen"),
    (lambda: os.system("true system"), "true system"),
    (lambda: os.popen("true popen2").close(), "true popen2"),
    (forks, "os.fork()"),
    (spawns, "true spawned"),
    (spawns_on_path, "true spawned"),
    (starts_a_multiprocessing_child, "multiprocessing mp-child"),
], ids=["run", "shell", "popen", "system", "os-popen", "fork", "posix_spawn", "posix_spawnp", "multiprocessing"])
def test_a_test_not_marked_slow_that_starts_a_process_fails_naming_it_and_the_command(start, named):
    with pytest.raises(pytest.fail.Exception) as failure:
        with _unless_slow(FAST, "call"):
            start()
    assert f"{FAST.nodeid} (call) is not marked slow, yet it started a process: {named}" in str(failure.value)


def test_a_refusal_the_code_under_test_caught_or_met_in_another_thread_still_fails_the_test():
    def swallows():
        try:
            subprocess.run(["true", "caught"])
        except BaseException:  # noqa: BLE001 - as careless code under test would
            pass

    def in_a_thread():
        thread = threading.Thread(target=swallows)
        thread.start()
        thread.join()

    for where in (swallows, in_a_thread):
        with pytest.raises(pytest.fail.Exception, match=r"\(setup\) is not marked slow, yet it started "
                                                          r"processes: \['true caught'\]"):
            with _unless_slow(FAST, "setup"):
                where()


def test_a_slow_test_is_not_guarded_and_the_guard_leaves_nothing_behind():
    patched = (subprocess.Popen._execute_child, os.fork, os.posix_spawn, os.system,
               multiprocessing.process.BaseProcess.start)
    with _unless_slow(SLOW, "call"):
        assert (subprocess.Popen._execute_child, os.fork, os.posix_spawn, os.system,
                multiprocessing.process.BaseProcess.start) == patched
    with no_processes("inner"):
        assert subprocess.Popen._execute_child is not patched[0]
    assert (subprocess.Popen._execute_child, os.fork, os.posix_spawn, os.system,
            multiprocessing.process.BaseProcess.start) == patched


def test_this_test_not_marked_slow_runs_under_the_guard():
    # conftest's hooks wrap each phase of a test not marked slow in the guard: here, the call.
    assert subprocess.Popen._execute_child.__module__ == "tests.helpers"
    assert os.fork.__module__ == "tests.helpers"


# ----------------------------------------------------------------------------- the two workers' groups

def test_the_integration_tests_share_one_worker_and_the_containers_and_each_unit_module_get_their_own():
    from tests.conftest import worker_group
    assert {worker_group(n) for n in ("tests/integration/test_cluster.py::test_a",
                                      "tests/integration/test_faults.py::test_b[x-1]")} == {"integration"}
    assert worker_group("tests/integration/test_containers.py::test_c") == "tests/integration/test_containers.py"
    assert worker_group("tests/unit/test_config.py::test_d[a::b]") == "tests/unit/test_config.py"


def test_the_scheduler_gives_each_group_whole_to_one_worker():
    from tests.conftest import GroupScheduling, worker_group
    scheduler = object.__new__(GroupScheduling)  # _split_scope reads nothing of its state
    for nodeid in ("tests/integration/test_cluster.py::test_a", "tests/integration/test_containers.py::test_c",
                   "tests/unit/test_spec.py::test_d[x]"):
        assert scheduler._split_scope(nodeid) == worker_group(nodeid)


@pytest.mark.parametrize(("workers", "threads"), [(None, 2), ("1", 2), ("2", 1), ("4", 1)])
def test_torch_gets_the_cores_shared_among_the_workers(monkeypatch, workers, threads):
    from tests.conftest import torch_threads_per_worker
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    if workers is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
    assert torch_threads_per_worker() == threads
