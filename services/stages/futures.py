"""How a stage's future ends, one helper per way. A caller may cancel a future at any time and
anyone may resolve it (``set_result`` is public): these helpers absorb both, so no misuse can
kill a stage's thread.
"""
from __future__ import annotations

import enum
import logging
import time
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

logger = logging.getLogger(__name__)


class Claim(enum.Enum):
    """What taking a future off a queue found."""
    RUN = "run"  # PENDING -> RUNNING: ours to resolve
    CANCELLED = "cancelled"  # the caller cancelled it (now CANCELLED_AND_NOTIFIED)
    RESOLVED_ELSEWHERE = "resolved elsewhere"  # someone holding it set it themselves


def claim(future: Future, owner: str) -> Claim:
    """Move a queued future to RUNNING; from then on its caller cannot cancel it."""
    try:
        return Claim.RUN if future.set_running_or_notify_cancel() else Claim.CANCELLED
    except RuntimeError:
        logger.warning("%s: skipping an item whose future was resolved outside the service", owner)
        return Claim.RESOLVED_ELSEWHERE


def set_result(future: Future, result: Any, owner: str) -> None:
    # A done-callback that raises must not reach the worker thread.
    try:
        future.set_result(result)
    except InvalidStateError:  # failed meanwhile by abort() or a dying stage: that answer stands
        logger.debug("%s: a result came for a future already resolved", owner)
    except Exception:  # noqa: BLE001
        logger.exception("%s: could not set a result", owner)


def set_exception(future: Future, error: BaseException, owner: str) -> bool:
    """True when this call failed the future (False: it was resolved already)."""
    try:
        future.set_exception(error)
        return True
    except InvalidStateError:
        logger.debug("%s: an error came for a future already resolved", owner)
    except Exception:  # noqa: BLE001
        logger.exception("%s: could not set an exception", owner)
    return False


def peek(future: Future, owner: str) -> Claim:
    """Like claim, but a live future stays PENDING: its caller may still cancel it while it runs."""
    return claim(future, owner) if future.done() else Claim.RUN


def end_with_result(future: Future, result: Any, owner: str) -> Claim:
    """Resolve a future that was left PENDING while it ran (see peek); a cancelled one stays cancelled."""
    outcome = claim(future, owner)
    if outcome is Claim.RUN:
        set_result(future, result, owner)
    return outcome


def end_with_exception(future: Future, error: BaseException, owner: str) -> Claim:
    """Fail a future not yet RUNNING (still queued, or left PENDING while it ran); cancelled stays cancelled."""
    outcome = claim(future, owner)
    if outcome is Claim.RUN:
        set_exception(future, error, owner)
    return outcome


def fail(future: Future, error: BaseException, owner: str) -> Claim:
    """Fail a future its stage holds, RUNNING (claimed) or left PENDING while it ran; an answered
    one stays answered, a cancelled one cancelled (CANCELLED -> notified)."""
    if future.running():
        return Claim.RUN if set_exception(future, error, owner) else Claim.RESOLVED_ELSEWHERE
    if future.done() and not future.cancelled():
        return Claim.RESOLVED_ELSEWHERE
    return end_with_exception(future, error, owner)


def results_by(futures: list[Future], deadline: float, timed_out: BaseException) -> list:
    """The futures' results by `deadline` (monotonic), else `timed_out` raised. Every future is
    cancelled on the way out (a no-op once done): unstarted items leave their queue."""
    try:
        return [future.result(timeout=max(0.0, deadline - time.monotonic())) for future in futures]
    except FutureTimeout:
        raise timed_out from None
    finally:
        for future in futures:
            future.cancel()
