"""A node's life: starting -> ready -> stopping (or failed), and the requests in flight.

One object per process, shared by the HTTP handlers (is the node ready? count this
request), the startup thread (load, then ready; or failed: /health says why for
FAILED_LINGER_S, then exit 1, or 2 for a ConfigError) and the signal handler
(SIGTERM/SIGINT: refuse new work with 503, let requests in flight finish within
SHUTDOWN_GRACE_S, answer those still running then with 503 "stopping", exit 0).
"""
from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from flask import Flask
from werkzeug.wsgi import ClosingIterator

from pipeline.config import ConfigError
from services.server.app import error_response
from services.server.errors import NodeNotReady, http_answer

log = logging.getLogger(__name__)

# After the last request in flight returns, waitress may still be writing its
# reply to the socket from its own loop: wait this long before the process exits.
EXIT_LINGER_S = 0.5
# After SHUTDOWN_GRACE_S, the requests still in flight are answered 503 at once: this bounds how
# long their replies may take to be handed to waitress before the process exits anyway.
ANSWER_WINDOW_S = 5.0
# A node whose load failed keeps answering /health "failed" (with the reason) and /ready 503 this
# long before it exits, so an operator or a probe polling it sees why rather than a refused connection.
FAILED_LINGER_S = 5.0
# Exit codes of a failed load: 2 when the operator must change something first (a ConfigError, e.g.
# models missing: a restart cannot help, and ./run.sh local gives up on it), else 1.
FAILED_EXIT, CONFIG_ERROR_EXIT = 1, 2
# Helper threads that run the app (InFlight): never the limit, as waitress's own threads
# (at most a few hundred) bound the requests running at once.
HELPER_THREADS = 4096


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


class _Call:
    """One request's app call, run on a helper thread while the HTTP thread waits for it to settle:
    either the app's reply is ready, or the node gave up on it (abandon) and answers for it."""

    def __init__(self, app, environ):
        self._app, self._environ = app, environ
        self._lock = threading.Lock()
        self.settled = threading.Event()
        self.outcome: str | None = None  # "done" or "abandoned": whichever came first
        self.start: tuple | None = None  # start_response's arguments, passed on by the HTTP thread
        self.written: list[bytes] = []  # the legacy write() callable's bytes, sent before the body
        self.result = None
        self.error: BaseException | None = None

    def settle(self, outcome: str) -> bool:
        """The first outcome wins; False if another came first."""
        with self._lock:
            if self.outcome is not None:
                return False
            self.outcome = outcome
        self.settled.set()
        return True

    def _start_response(self, status, headers, exc_info=None):
        self.start = (status, headers, exc_info)
        return self.written.append

    def run(self) -> None:
        try:
            self.result = self._app(self._environ, self._start_response)
        except BaseException as exc:  # noqa: BLE001 - handed to the HTTP thread, which raises it
            self.error = exc
        if not self.settle("done") and hasattr(self.result, "close"):
            self.result.close()  # answered already (abandoned): release what the reply held


class InFlight:
    """HTTP requests between their arrival and the end of their reply; the drain waits on it.

    Each request's app runs on a helper thread and its HTTP thread waits for it, so that at the
    end of the grace period the node can still answer a request whose computation cannot be
    interrupted (a call to another node, a batch in progress): abandon() answers it for the app.
    """

    def __init__(self):
        self._count = 0
        self._idle = threading.Condition()
        self._calls: set[_Call] = set()
        self._abandoned: BaseException | None = None  # the error every waiting request is answered with
        self._helpers = ThreadPoolExecutor(max_workers=HELPER_THREADS, thread_name_prefix="request")

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

    def abandon(self, error: BaseException) -> int:
        """Answer every request still waiting on its app, and every later one, with `error`
        (through the errors table); how many were waiting."""
        with self._idle:
            self._abandoned = error
            calls, self._calls = list(self._calls), set()
        return sum(call.settle("abandoned") for call in calls)

    def track(self, app: Flask) -> None:
        """Count every request of `app` until its reply has been handed to waitress.

        A WSGI wrapper rather than Flask hooks: teardown_request runs before the
        reply body is handed over, so a drain that trusted it could cut replies.
        """
        inner = app.wsgi_app

        def counted(environ, start_response):
            self.enter()
            try:
                return ClosingIterator(self._call(app, inner, environ, start_response), [self.leave])
            except BaseException:
                self.leave()
                raise

        app.wsgi_app = counted  # type: ignore[method-assign]  # Flask's documented way to wrap the WSGI app

    def _call(self, app: Flask, inner, environ, start_response):
        call = _Call(inner, environ)
        with self._idle:
            accepted = self._abandoned is None
            if accepted:
                self._calls.add(call)
        if accepted:
            self._helpers.submit(call.run)
            call.settled.wait()  # bounded by the app itself, or by abandon() at the grace deadline
            with self._idle:
                self._calls.discard(call)
        else:  # abandoned already: the node is about to exit
            call.settle("abandoned")
        if call.outcome == "abandoned":
            return self._answer_for(app, environ, start_response)
        if call.error is not None:
            raise call.error
        if call.start is None:  # an app that returned without starting its reply: a bug
            raise RuntimeError("the app returned without calling start_response")
        start_response(*call.start)
        if not call.written:
            return call.result
        close = [call.result.close] if hasattr(call.result, "close") else []
        return ClosingIterator(itertools.chain(call.written, call.result), close)

    def _answer_for(self, app: Flask, environ, start_response):
        answer = http_answer(self._abandoned) if self._abandoned is not None else None
        if answer is None:
            raise RuntimeError(f"no HTTP answer for {self._abandoned!r}")
        with app.app_context():
            response = error_response(answer.status, answer.message, field=answer.field,
                                      retry_after_s=answer.retry_after_s)
        return response(environ, start_response)


class Lifecycle:
    """Readiness, in-flight tracking and drain of one node; `name` is how errors call it."""

    def __init__(self, name: str, grace_s: float, *, exit: Callable[[int], None] = os._exit,
                 failed_linger_s: float = FAILED_LINGER_S):
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
        reason) for failed_linger_s, then exit 1 (2 for a ConfigError)."""
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
             on_deadline: Callable[[str], None] = lambda reason: None) -> threading.Thread | None:
        """Refuse new work from now on, then drain and exit 0 on a thread of its own.

        None when already stopping. `on_stop` runs first (the gateway stops probing);
        `on_deadline(reason)` runs if requests are still in flight when grace_s ends (the
        stages fail what they hold, so the threads waiting on them return).
        """
        if not self.readiness.stop():
            return None
        on_stop()
        thread = threading.Thread(target=self._drain_and_exit, args=(on_deadline,), name="drain", daemon=True)
        thread.start()
        return thread

    def _drain_and_exit(self, on_deadline: Callable[[str], None]) -> None:
        left = self.drain()
        if left:
            self._answer_the_rest(left, on_deadline)
            left = self.in_flight.wait_idle(ANSWER_WINDOW_S)
        time.sleep(EXIT_LINGER_S)
        log.info("%s stopped (in flight at exit: %d)", self.name, left)
        logging.shutdown()
        self._exit(0)

    def _answer_the_rest(self, left: int, on_deadline: Callable[[str], None]) -> None:
        """Past the grace: every request still in flight gets a 503 saying the node is stopping."""
        reason = f"{self.name} is stopping: SHUTDOWN_GRACE_S ({self.grace_s:g} s) ended before this request did"
        log.warning("%s: %d requests still in flight after SHUTDOWN_GRACE_S; answering them 503", self.name, left)
        answered = self.in_flight.abandon(NodeNotReady(f"{reason}; retry"))
        try:
            on_deadline(reason)
        except Exception:  # noqa: BLE001 - the 503s above are given; the exit must still come
            log.exception("%s: failing the stages' work at the deadline failed", self.name)
        log.info("%s: answered %d requests 503", self.name, answered)

    def install_signal_handlers(self, on_stop: Callable[[], None] = lambda: None,
                                on_deadline: Callable[[str], None] = lambda reason: None) -> None:
        """SIGTERM and SIGINT start the drain (once)."""
        def on_signal(signum, _frame):
            if self.readiness.state != Readiness.STOPPING:
                log.info("%s got signal %d: draining", self.name, signum)
            self.stop(on_stop, on_deadline)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
