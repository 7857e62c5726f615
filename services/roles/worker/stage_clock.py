"""A request's time in each stage, measured once: the completion line's stages_ms and, with
tracing on, the stage's span; and, on the node's Upstream, the stages it may still submit to."""
from __future__ import annotations

import time
from concurrent.futures import Future
from contextvars import ContextVar
from typing import Any, Callable

from pipeline.spec import Stage
from services.server import stage_spans
from services.stages.protocol import StageService
from services.stages.upstream import Route

# Where Worker.answer records how long the request waited on each stage, for the node's completion
# log line: kept out of the reply, whose fields are the contract. Per thread (one request each).
_stage_times: ContextVar[dict[str, float] | None] = ContextVar("stage_times", default=None)


def collect_stage_times() -> dict[str, float]:
    """A dict this thread's next Worker.answer fills with {stage: ms waited}, even if it fails."""
    times: dict[str, float] = {}
    _stage_times.set(times)
    return times


class StageVisit:
    """One request in one stage: from submitting to it until its result (or error) is back."""

    def __init__(self, stage: Stage, span: stage_spans.StageSpan | None):
        self.stage = stage
        self.span = span
        self.started = time.perf_counter()
        self._future: Future | None = None

    def submit(self, service: StageService, item) -> "StageVisit":
        """Every stage service unwraps a noted item, telling the span the batch it ran in."""
        self._future = service.submit(stage_spans.noted(self.span, item))
        return self

    @property
    def future(self) -> Future:
        if self._future is None:
            raise RuntimeError(f"the {self.stage} stage was waited on before anything was submitted to it")
        return self._future


class StageClock:
    """Times one request's stages once: its stages_ms entry on the completion line and, with tracing
    on, its stage span (a child of the request's server span). Its route passes a stage when the
    request first waits on it: all its items are in by then (a /v1/embeddings request's several
    texts), and a batch closing before that would leave some of them to the next one."""

    def __init__(self, times: dict[str, float] | None, request_id: str, wait: Callable[[str, Future, float], Any],
                 route: Route | None = None):
        self.times = times
        self.request_id = request_id
        self._wait = wait  # Worker._wait: the stage's result by the deadline, errors mapped
        self._route = route
        self._open: list[StageVisit] = []

    @classmethod
    def for_this_thread(cls, request_id: str, wait: Callable[[str, Future, float], Any],
                        route: Route | None = None) -> StageClock:
        """A clock filling the dict collect_stage_times gave this thread (none: times are not kept)."""
        return cls(_stage_times.get(), request_id, wait, route)

    def enter(self, stage: Stage) -> StageVisit:
        visit = StageVisit(stage, stage_spans.start_stage(stage, self.request_id))
        self._open.append(visit)
        return visit

    def wait(self, visit: StageVisit, deadline: float):
        if self._route is not None:  # through the furthest stage entered: sentiment's wait passes toxicity too
            self._route.passed(*(open_visit.stage for open_visit in self._open))
        error: BaseException | None = None
        try:
            return self._wait(visit.stage, visit.future, deadline)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._leave(visit, time.perf_counter() - visit.started, error)

    def _leave(self, visit: StageVisit, elapsed_s: float, error: BaseException | None) -> None:
        self._open.remove(visit)
        if self.times is not None:
            self.times[str(visit.stage)] = round(elapsed_s * 1000, 1)
        if visit.span is not None:
            visit.span.end(elapsed_s, error)

    def close(self) -> None:
        """End the spans of stages the request left unawaited (not in stages_ms), and its route."""
        if self._route is not None:
            self._route.end()
        for visit in list(self._open):
            self._open.remove(visit)
            if visit.span is not None:
                visit.span.end(time.perf_counter() - visit.started, RuntimeError("not awaited"))
