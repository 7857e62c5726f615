"""A request's span in each stage, started on the request's thread and ended with the duration
the completion line's stages_ms gets; its batch's size and queue wait come from the stage thread
(`noting_batches`, `noted`). With tracing off every helper returns at once.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from services.server import tracing


class _Noted:
    """An item on its way through a stage, with the stage span that wants to know its batch."""
    __slots__ = ("item", "span")

    def __init__(self, item, span: "StageSpan"):
        self.item, self.span = item, span


def noting_batches(batch_fn: Callable[[list], list]) -> Callable[[list], list]:
    """batch_fn for items `noted` may have wrapped: a wrapped item's span learns its batch's size
    and start; batch_fn gets the items as they were."""
    def noted_batch(items: list) -> list:
        started, size = time.monotonic(), len(items)
        return batch_fn([_unwrap(item, started, size) for item in items])
    return noted_batch


def _unwrap(item, started: float, size: int):
    if type(item) is not _Noted:
        return item
    item.span._batch = (started, size)  # a one-by-one retry notes its batch of one last
    return item.item


def admitted(item, running: int):
    """The item as submitted, for continuous generate: a `noted` item's span learns when it joined
    the running batch and its size."""
    return _unwrap(item, time.monotonic(), running)


def noted(span: "StageSpan | None", item):
    """The item to submit to a stage whose batch_fn went through noting_batches."""
    return item if span is None else _Noted(item, span)


class StageSpan:
    """A request's span in one stage, ended by the caller with the duration it measured."""

    def __init__(self, span, started_ns: int):
        self.span = span
        self.started_ns = started_ns
        self._entered = time.monotonic()
        self._batch: tuple[float, int] | None = None  # (monotonic start, size) of the batch it ran in

    @property
    def context(self):
        """This span's context, for work done on its behalf on another thread (a batched call)."""
        return self.span.get_span_context()

    def end(self, duration_s: float, error: BaseException | None = None, **attributes: Any) -> None:
        batch = self._batch
        if batch is not None:
            self.span.set_attribute("rag.batch_size", batch[1])
            self.span.set_attribute("rag.queue_wait_ms", round(max(0.0, batch[0] - self._entered) * 1000, 3))
        for key, value in attributes.items():
            if value is not None:
                self.span.set_attribute(key, value)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode
            self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200]))
        self.span.end(end_time=self.started_ns + int(duration_s * 1e9))


def start_stage(stage: str, request_id: str | None = None) -> StageSpan | None:
    """The span of the current request in `stage` (a child of the current span), or None when off."""
    state = tracing.active()
    if state is None:
        return None
    started_ns = time.time_ns()
    span = state.tracer.start_span(str(stage), start_time=started_ns,
                                   attributes={"rag.stage": str(stage), tracing.REQUEST_ID: request_id or ""})
    return StageSpan(span, started_ns)
