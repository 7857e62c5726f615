"""Readiness, in-flight counting and the drain deadline, without a server and without sleeps."""
from __future__ import annotations

import threading
import time

import pytest
from flask import Flask

from services.errors import NodeNotReady
from services.lifecycle import InFlight, Lifecycle, Readiness

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

    threading.Thread(target=drain, daemon=True).start()
    assert not done.wait(0.05)  # still waiting on the request in flight
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


def test_a_failed_load_exits_one():
    exited = threading.Event()
    codes = []
    life = Lifecycle("node 2", grace_s=0.0, exit=lambda code: (codes.append(code), exited.set()))

    def load():
        raise OSError("no index")

    life.start_loading(load).join(10)
    assert codes == [1] and life.readiness.state == Readiness.FAILED
    assert life.readiness.detail == "OSError: no index"
    life2 = Lifecycle("node 2", grace_s=0.0, exit=lambda code: codes.append(code))
    life2.start_loading(lambda: None).join(10)
    assert life2.ready and codes == [1]
