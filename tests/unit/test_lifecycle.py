"""Readiness, in-flight counting and the drain deadline, without a server and without sleeps."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest
from flask import Flask

from pipeline.config import Settings
from services.server.app import make_app
from services.server.errors import NodeNotReady
from services.server.lifecycle import ANSWER_WINDOW_S, EXIT_LINGER_S, InFlight, Lifecycle, Readiness
from tests.helpers import blocked_in, wait_until

pytestmark = pytest.mark.timeout(30)


def test_require_ready_refuses_until_ready_and_after_stop():
    life = Lifecycle("node 1", grace_s=0.0, exit=lambda code: None)
    with pytest.raises(NodeNotReady, match="node 1 is starting"):
        life.require_ready()
    life.readiness.set(Readiness.READY)
    life.require_ready()
    assert life.readiness.stop() and not life.readiness.stop()  # the second signal changes nothing
    with pytest.raises(NodeNotReady, match="index server is stopping"):
        life.require_ready("index server")


def test_in_flight_counts_until_the_reply_is_closed():
    app = Flask("t")

    @app.get("/x")
    def x():
        return "ok"

    in_flight = InFlight()
    in_flight.track(app)
    client = app.test_client()
    response = client.get("/x", buffered=False)
    assert in_flight.count == 1  # the body has not been handed over yet
    response.close()
    assert in_flight.count == 0


def test_in_flight_leaves_when_the_app_raises():
    in_flight = InFlight()

    class Boom(Exception):
        pass

    def broken(environ, start_response):
        raise Boom

    app = Flask("t")
    app.wsgi_app = broken
    in_flight.track(app)
    with pytest.raises(Boom):
        app.wsgi_app({}, lambda *a: None)
    assert in_flight.count == 0


def test_drain_returns_at_once_when_idle_and_counts_what_is_left_at_the_deadline():
    life = Lifecycle("node 0", grace_s=0.0, exit=lambda code: None)
    assert life.drain() == 0
    life.in_flight.enter()
    life.in_flight.enter()
    assert life.drain() == 2  # grace 0: the deadline is now; nothing is waited for


def test_drain_ends_as_soon_as_the_last_request_leaves():
    life = Lifecycle("node 0", grace_s=60.0, exit=lambda code: None)
    life.in_flight.enter()
    done = threading.Event()
    left = []

    def drain():
        left.append(life.drain())
        done.set()

    draining = threading.Thread(target=drain, daemon=True)
    draining.start()
    wait_until(lambda: blocked_in(draining, "wait_idle"), 10, "drain() never waited")
    assert not done.is_set()  # still waiting on the request in flight
    started = time.monotonic()
    life.in_flight.leave()
    assert done.wait(10) and left == [0]
    assert time.monotonic() - started < 5  # woken by the leave, not by the 60 s deadline


def test_stop_refuses_new_work_runs_on_stop_once_and_exits_zero():
    exited = threading.Event()
    codes, stops = [], []

    def exit_(code):
        codes.append(code)
        exited.set()

    life = Lifecycle("node 0", grace_s=0.0, exit=exit_)
    life.readiness.set(Readiness.READY)
    assert life.stop(lambda: stops.append(1)) is not None
    assert life.stop(lambda: stops.append(2)) is None
    assert life.readiness.state == Readiness.STOPPING and stops == [1]
    assert exited.wait(10) and codes == [0]


def test_the_exit_waits_until_every_reply_is_written_and_no_longer(caplog):
    """Nothing in flight: the node exits once the HTTP server says every reply is on its socket."""
    exited = threading.Event()
    polls = iter([2, 1, 0])
    seen = []

    def unsent():
        seen.append(next(polls))
        return seen[-1]

    life = Lifecycle("node 0", grace_s=0.0, exit=lambda code: exited.set())
    life.readiness.set(Readiness.READY)
    with caplog.at_level("INFO", logger="services.server.lifecycle"):
        life.stop(unsent=unsent)
        assert exited.wait(10)
    assert seen == [2, 1, 0]  # looked until none was left, then exited without another look
    assert "node 0 stopped (in flight at exit: 0)" in caplog.text and "still being written" not in caplog.text


def test_a_reply_that_is_never_taken_holds_the_exit_only_for_the_linger(caplog):
    exited = threading.Event()
    life = Lifecycle("node 0", grace_s=0.0, exit=lambda code: exited.set())
    life.readiness.set(Readiness.READY)
    with caplog.at_level("INFO", logger="services.server.lifecycle"):
        started = time.monotonic()
        life.stop(unsent=lambda: 1)
        assert exited.wait(10)
    assert time.monotonic() - started >= EXIT_LINGER_S
    assert "node 0 stopped (in flight at exit: 0, replies still being written: 1)" in caplog.text


def test_a_failed_load_exits_one():
    exited = threading.Event()
    codes = []
    life = Lifecycle("node 2", grace_s=0.0, exit=lambda code: (codes.append(code), exited.set()),
                     failed_linger_s=0.0)

    def load():
        raise OSError("no index")

    life.start_loading(load).join(10)
    assert codes == [1] and life.readiness.state == Readiness.FAILED
    assert life.readiness.detail == "OSError: no index"
    life2 = Lifecycle("node 2", grace_s=0.0, exit=lambda code: codes.append(code))
    life2.start_loading(lambda: None).join(10)
    assert life2.ready and codes == [1]


def test_a_failed_load_says_failed_with_the_reason_through_the_linger_then_a_config_error_exits_2():
    from pipeline.config import ConfigError
    from services.server.lifecycle import CONFIG_ERROR_EXIT
    seen = []  # what the node said when it exited, and after how long
    life = Lifecycle("node 1", grace_s=0.0, failed_linger_s=0.3,
                     exit=lambda code: seen.append((code, life.readiness.state, life.readiness.detail,
                                                    time.monotonic() - started)))

    def load():
        raise ConfigError("MODEL_SOURCE=hub: models missing; fetch them with: hf download a/b")

    started = time.monotonic()
    life.start_loading(load).join(10)
    [(code, state, detail, after_s)] = seen
    assert (code, state) == (CONFIG_ERROR_EXIT, Readiness.FAILED) and after_s >= 0.3
    assert detail == "MODEL_SOURCE=hub: models missing; fetch them with: hf download a/b"


# ---------------------------------------------------------------- past the grace: every request answered


def waiting_app(waited_on: Future, entered: threading.Event) -> Flask:
    """/slow waits on a future, as a request waits on a stage or on another node; errors go
    through the errors table."""
    app = make_app("t")

    @app.get("/slow")
    def slow():
        entered.set()
        return {"late": waited_on.result(10)}

    return app


def test_at_the_grace_deadline_the_roles_abandon_answers_requests_in_flight_503_and_the_node_exits_0():
    waited_on, entered = Future(), threading.Event()
    app = waiting_app(waited_on, entered)
    exited, codes, deadlines = threading.Event(), [], []
    life = Lifecycle("node 1", grace_s=0.2, exit=lambda code: (codes.append(code), exited.set()))
    life.in_flight.track(app)
    life.readiness.set(Readiness.READY)

    def abandon(reason: str) -> None:  # what a role does: fail what its requests wait on
        deadlines.append(reason)
        waited_on.set_exception(NodeNotReady(f"{reason}; retry"))

    replies, answered = [], threading.Event()
    threading.Thread(target=lambda: (replies.append(app.test_client().get("/slow")), answered.set()),
                     daemon=True).start()
    assert entered.wait(10)
    started = time.monotonic()
    life.stop(on_deadline=abandon)
    assert answered.wait(10) and time.monotonic() - started < ANSWER_WINDOW_S  # at the deadline
    assert replies[0].status_code == 503 and "node 1 is stopping" in replies[0].json["error"]
    assert replies[0].headers["Retry-After"] == "5"
    replies[0].close()  # handed over: nothing is in flight, the node exits
    assert exited.wait(10) and codes == [0]
    assert len(deadlines) == 1 and "SHUTDOWN_GRACE_S" in deadlines[0]


def test_a_request_that_finishes_within_the_grace_keeps_its_own_reply_and_nothing_is_abandoned():
    waited_on, entered = Future(), threading.Event()
    app = waiting_app(waited_on, entered)
    exited, deadlines = threading.Event(), []
    life = Lifecycle("node 1", grace_s=5.0, exit=lambda code: exited.set())
    life.in_flight.track(app)
    life.readiness.set(Readiness.READY)
    replies = []
    client = threading.Thread(target=lambda: replies.append(app.test_client().get("/slow")), daemon=True)
    client.start()
    assert entered.wait(10) and life.in_flight.count == 1
    life.stop(on_deadline=deadlines.append)
    waited_on.set_result("done")
    client.join(10)
    assert replies[0].json == {"late": "done"}
    replies[0].close()  # the reply handed over: the request leaves, the drain ends
    assert exited.wait(10) and deadlines == [] and life.in_flight.count == 0


def test_health_says_unhealthy_with_the_reason_when_a_stage_thread_died():
    from services.roles.base import Role
    from services.server.routes import build_app

    class Stage:
        name, failure = "generate", None

        def stats(self):
            raise AssertionError("not asked")

    stage = Stage()

    class OneStage(Role):
        name = "worker"
        uses_torch = False

        def register_routes(self, app):
            pass

        def batching_services(self):
            return (stage,)

    life = Lifecycle("node 1", grace_s=0.0, exit=lambda code: None)
    app = build_app(OneStage(Settings.from_env({}), 1, life), life)
    life.readiness.set(Readiness.READY)
    client = app.test_client()
    assert client.get("/health").status_code == 200
    stage.failure = "RuntimeError: cleanup failed"
    reply = client.get("/health")
    assert reply.status_code == 503 and reply.json["status"] == "unhealthy"
    assert reply.json["detail"] == "the generate stage stopped: RuntimeError: cleanup failed"


# ---------------------------------------------------------------- the local launcher's supervisor


class FakeProc:
    def __init__(self, code=None):
        self.returncode = code

    def poll(self):
        return self.returncode


class FakeCluster:
    def __init__(self):
        self.procs = {0: FakeProc(), 1: FakeProc(), 2: FakeProc()}
        self.started = []

    def start_node(self, node):
        self.started.append(node)
        self.procs[node] = FakeProc()

    def log_path(self, node):
        return f"node{node}.log"

    def tail(self, node, lines=30):
        return ""


def test_supervisor_restarts_a_dead_node_within_its_rate_then_gives_up_and_keeps_the_others():
    from tests.helpers import ManualClock
    from tools.local import Supervisor
    cluster, clock = FakeCluster(), ManualClock()
    supervisor = Supervisor(cluster, limit=2, window_s=60, clock=clock)
    supervisor.check()
    assert cluster.started == []  # all alive
    for _ in range(2):
        cluster.procs[1].returncode = -9
        supervisor.check()
        clock.now += 1
    assert cluster.started == [1, 1]
    cluster.procs[1].returncode = -9
    supervisor.check()  # a third death within the window: given up on
    assert cluster.started == [1, 1] and 1 not in cluster.procs and supervisor.given_up == {1}
    assert set(cluster.procs) == {0, 2}
    clock.now += 120  # the window forgets old restarts: node 0 may restart twice again
    cluster.procs[0].returncode = 1
    supervisor.check()
    assert cluster.started == [1, 1, 0]


def test_supervisor_does_not_restart_a_node_with_a_config_error():
    from tools.local import Supervisor
    cluster = FakeCluster()
    cluster.procs[2].returncode = 2
    supervisor = Supervisor(cluster, limit=5, window_s=60)
    supervisor.check()
    assert cluster.started == [] and supervisor.given_up == {2} and set(cluster.procs) == {0, 1}


@pytest.mark.slow  # a process that sends itself SIGTERM
def test_a_sigterm_before_the_drains_handlers_exits_0_at_once():
    # Outside a container the default action kills with -15; as PID 1 it is ignored (a SIGKILL
    # at the end of the stop grace): either way not a clean exit, which this handler gives.
    import subprocess
    import sys
    code = ("import os, signal, time; from services.server.lifecycle import exit_on_sigterm_until_serving; "
            "exit_on_sigterm_until_serving(); os.kill(os.getpid(), signal.SIGTERM); time.sleep(10); print('alive')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert result.returncode == 0 and "alive" not in result.stdout, (result.returncode, result.stderr)
