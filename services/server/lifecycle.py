"""A node's life: starting -> ready -> stopping (or failed), and the requests in flight. On
SIGTERM/SIGINT: refuse new work (503), let requests in flight finish within SHUTDOWN_GRACE_S,
answer those still running then with 503 "stopping", exit 0.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Callable

from flask import Flask
from werkzeug.wsgi import ClosingIterator

from pipeline.config import ConfigError
from services.server.errors import NodeNotReady

log = logging.getLogger(__name__)

# After the last request in flight returns, waitress may still be writing its reply: the exit waits
# until every reply is written to its socket, for at most EXIT_LINGER_S, looking every SENT_POLL_S.
EXIT_LINGER_S = 0.5
SENT_POLL_S = 0.01
# How long the 503s of the requests still in flight after SHUTDOWN_GRACE_S may take to go out.
ANSWER_WINDOW_S = 5.0
# Exit codes of a failed load: 2 when the operator must change something first (a ConfigError, e.g.
# models missing: a restart cannot help, and ./run.sh local gives up on it), else 1.
FAILED_EXIT, CONFIG_ERROR_EXIT = 1, 2


class Readiness:
    STARTING, READY, FAILED, STOPPING = "starting", "ready", "failed", "stopping"

    def __init__(self):
        self._state = self.STARTING
        self._detail = ""
        self._lock = threading.Lock()

    def set(self, state: str, detail: str = "") -> None:
        with self._lock:
            self._state, self._detail = state, detail

    def stop(self) -> bool:
        """Move to STOPPING; False if it already was (a second signal changes nothing)."""
        with self._lock:
            if self._state == self.STOPPING:
                return False
            self._state, self._detail = self.STOPPING, ""
            return True

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    @property
    def detail(self) -> str:
        with self._lock:
            return self._detail

    @property
    def ready(self) -> bool:
        return self.state == self.READY


class InFlight:
    """HTTP requests between their arrival and the end of their reply; the drain waits on it."""

    def __init__(self):
        self._count = 0
        self._idle = threading.Condition()

    def enter(self) -> None:
        with self._idle:
            self._count += 1

    def leave(self) -> None:
        with self._idle:
            self._count -= 1
            if self._count == 0:
                self._idle.notify_all()

    @property
    def count(self) -> int:
        with self._idle:
            return self._count

    def wait_idle(self, timeout_s: float) -> int:
        """Block until nothing is in flight or timeout_s passed; the count left."""
        with self._idle:
            self._idle.wait_for(lambda: self._count == 0, timeout=max(0.0, timeout_s))
            return self._count

    def track(self, app: Flask) -> None:
        """Count every request of `app` until its reply has been handed to waitress (a WSGI wrapper:
        teardown_request runs before the body is handed over, so a drain trusting it could cut replies)."""
        inner = app.wsgi_app

        def counted(environ, start_response):
            self.enter()
            try:
                return ClosingIterator(inner(environ, start_response), [self.leave])
            except BaseException:
                self.leave()
                raise

        app.wsgi_app = counted  # type: ignore[method-assign]  # Flask's documented way to wrap the WSGI app


def _wait_all_sent(unsent: Callable[[], int] | None) -> int:
    """Until `unsent()` is 0, at most EXIT_LINGER_S (all of it where `unsent` is None); what is left."""
    if unsent is None:
        time.sleep(EXIT_LINGER_S)
        return 0
    deadline = time.monotonic() + EXIT_LINGER_S
    while (left := unsent()) and time.monotonic() < deadline:
        time.sleep(SENT_POLL_S)  # waitress signals no flush: look again
    return left


def exit_on_sigterm_until_serving() -> None:
    """Until install_signal_handlers replaces it: SIGTERM exits 0 at once (nothing can be in flight
    before the server listens). Without it a node that is PID 1 in a container ignores a SIGTERM
    that comes while it imports its libraries (the kernel drops default-action signals to PID 1),
    and waits for the SIGKILL at the end of the stop grace: a scale-down of a starting worker."""
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))


class Lifecycle:
    """Readiness, in-flight tracking and drain of one node; `name` is how errors call it."""

    def __init__(self, name: str, grace_s: float, *, exit: Callable[[int], None] = os._exit,
                 failed_linger_s: float = 0.0):
        self.name = name
        self.grace_s = grace_s
        self.failed_linger_s = failed_linger_s
        self.readiness = Readiness()
        self.in_flight = InFlight()
        self._exit = exit  # os._exit: waitress's threads must not keep a drained node alive

    @property
    def ready(self) -> bool:
        return self.readiness.ready

    def require_ready(self, who: str | None = None) -> None:
        """Raise NodeNotReady (503 + Retry-After) unless the node serves requests; `who` names it."""
        state = self.readiness.state
        if state != Readiness.READY:
            raise NodeNotReady(f"{who or self.name} is {state}")

    def start_loading(self, load: Callable[[], None]) -> threading.Thread:
        """Run `load` in the background: ready when it returns; when it raises, failed (with the
        reason) for failed_linger_s (FAILED_LINGER_S: so a probe sees why rather than a refused
        connection), then exit 1 (2 for a ConfigError)."""
        def run():
            try:
                load()
            except Exception as exc:
                self._fail(exc)
                return
            self.readiness.set(Readiness.READY)
            log.info("%s is ready", self.name)
        thread = threading.Thread(target=run, name="startup", daemon=True)
        thread.start()
        return thread

    def _fail(self, exc: Exception) -> None:
        if isinstance(exc, ConfigError):  # the operator's to fix: the message says how; no traceback
            detail, code = "; ".join(exc.problems), CONFIG_ERROR_EXIT
            log.error("%s failed to start: %s", self.name, detail)
        else:  # a bug or an environment problem we did not foresee: the traceback helps
            detail, code = f"{type(exc).__name__}: {exc}", FAILED_EXIT
            log.exception("%s failed to start", self.name)
        self.readiness.set(Readiness.FAILED, detail)
        log.info("%s answers /health 'failed' for %g s, then exits %d", self.name, self.failed_linger_s, code)
        time.sleep(self.failed_linger_s)
        if self.readiness.state == Readiness.FAILED:  # a signal meanwhile: the drain exits instead
            logging.shutdown()
            self._exit(code)

    def drain(self) -> int:
        """Wait up to grace_s for the requests in flight; how many are still running."""
        return self.in_flight.wait_idle(self.grace_s)

    def stop(self, on_stop: Callable[[], None] = lambda: None,
             on_deadline: Callable[[str], None] = lambda reason: None,
             unsent: Callable[[], int] | None = None) -> threading.Thread | None:
        """Refuse new work, then drain and exit 0 on a thread of its own; None when already stopping.
        `on_stop` runs first; `on_deadline(reason)` if requests are still in flight when grace_s ends.
        `unsent()`: how many replies are not all written yet (the HTTP server's count); the exit
        waits for none, at most EXIT_LINGER_S. Without it the exit waits EXIT_LINGER_S."""
        if not self.readiness.stop():
            return None
        on_stop()
        thread = threading.Thread(target=self._drain_and_exit, args=(on_deadline, unsent), name="drain", daemon=True)
        thread.start()
        return thread

    def _drain_and_exit(self, on_deadline: Callable[[str], None], unsent: Callable[[], int] | None) -> None:
        left = self.drain()
        if left:
            self._answer_the_rest(left, on_deadline)
            left = self.in_flight.wait_idle(ANSWER_WINDOW_S)
        cut = _wait_all_sent(unsent)
        log.info("%s stopped (in flight at exit: %d%s)", self.name, left,
                 f", replies still being written: {cut}" if cut else "")
        logging.shutdown()
        self._exit(0)

    def _answer_the_rest(self, left: int, on_deadline: Callable[[str], None]) -> None:
        """Past the grace: what the requests still in flight wait on fails now, so each gets its 503."""
        reason = f"{self.name} is stopping: SHUTDOWN_GRACE_S ({self.grace_s:g} s) ended before this request did"
        log.warning("%s: %d requests still in flight after SHUTDOWN_GRACE_S; answering them 503", self.name, left)
        try:
            on_deadline(reason)
        except Exception:  # noqa: BLE001 - the exit must still come
            log.exception("%s: failing the work in flight at the deadline failed", self.name)

    def install_signal_handlers(self, on_stop: Callable[[], None] = lambda: None,
                                on_deadline: Callable[[str], None] = lambda reason: None,
                                unsent: Callable[[], int] | None = None) -> None:
        """SIGTERM and SIGINT start the drain (once): :meth:`stop`."""
        def on_signal(signum, _frame):
            if self.readiness.state != Readiness.STOPPING:
                log.info("%s got signal %d: draining", self.name, signum)
            self.stop(on_stop, on_deadline, unsent)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
