"""Calls to another node whose callers can all be answered at once: at the end of SHUTDOWN_GRACE_S
every waiting caller must get an answer, though a call on the wire cannot be interrupted. Each call
runs on a pool thread while its caller waits on a Future, which ``abort`` fails (a late outcome is
dropped).
"""
from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class AbortableCalls:
    """Runs blocking calls on at most `max_workers` threads; `abort` answers every caller now."""

    def __init__(self, name: str, max_workers: int):
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._waiting: set[Future] = set()
        self._open: set[Any] = set()  # responses being read (streams): closed by abort
        self._abort_error: Callable[[], BaseException] | None = None

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a pool thread, in a copy of the caller's context: its result or error, or
        abort's error if that comes first. fn must bound its own time."""
        waiter: Future = Future()
        with self._lock:
            if self._abort_error is not None:
                raise self._abort_error()
            self._waiting.add(waiter)
        try:
            self._pool.submit(self._run, waiter, contextvars.copy_context().run, (fn, *args))
            return waiter.result()
        finally:
            with self._lock:
                self._waiting.discard(waiter)

    @staticmethod
    def _run(waiter: Future, fn: Callable[..., Any], args: tuple) -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - the caller's to raise
            _settle(waiter, error=exc)
        else:
            _settle(waiter, result=result)

    def hold(self, resource: Any) -> None:
        """A response the caller reads past call(): abort closes it, ending a read blocked on it."""
        with self._lock:
            if self._abort_error is None:
                self._open.add(resource)
                return
        resource.close()

    def release(self, resource: Any) -> None:
        with self._lock:
            self._open.discard(resource)

    def aborted(self) -> BaseException | None:
        """abort's error, once it has been called."""
        with self._lock:
            return self._abort_error() if self._abort_error is not None else None

    def abort(self, make_error: Callable[[], BaseException]) -> int:
        """Fail every call waiting now, and refuse every later one, with a new make_error() each;
        close every held response; how many calls were waiting."""
        with self._lock:
            self._abort_error = make_error
            waiting, self._waiting = list(self._waiting), set()
            held, self._open = list(self._open), set()
        for resource in held:
            try:
                resource.close()
            except Exception:  # noqa: BLE001 - closing a socket another thread reads may complain
                pass
        return sum(_settle(waiter, error=make_error()) for waiter in waiting)

    def close(self) -> None:
        self._pool.shutdown(wait=False)  # calls already submitted still run and answer their callers


def _settle(waiter: Future, *, result: Any = None, error: BaseException | None = None) -> bool:
    """The first outcome wins (the call's, or abort's); True if this one did."""
    try:
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(result)
    except InvalidStateError:
        return False
    return True
