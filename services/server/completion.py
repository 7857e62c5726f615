"""What one request's completion line says beyond its status and latency: which worker computed it
and how long it waited on each stage. The edge opens the record and notes the final answer's
`served_by` (services/server/answer.py); below it, the worker notes the stage times of a request
computed on this node (a failure's too), and the gateway's router those of a final answer another
node computed for it (not those of an answer replayed: it computed nothing)."""
from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass
class Completion:
    served_by: int | str | None = None
    stages_ms: dict[str, float] = field(default_factory=dict)
    # From the reply, for the metrics (services/server/metrics.py): the prompt's tokens and why
    # generation stopped, where the reply says.
    prompt_tokens: int | None = None
    finish_reason: str | None = None


# Per thread: a request is served on one HTTP thread, its answer stream read on that thread too.
_current: ContextVar[Completion | None] = ContextVar("completion", default=None)


def begin() -> Completion:
    """A fresh record for the request this thread now serves."""
    record = Completion()
    _current.set(record)
    return record


def current() -> Completion | None:
    """The record of the request this thread serves (None outside a request: nothing is noted)."""
    return _current.get()


def note_stages(times: dict[str, float]) -> None:
    """Stage times for the completion line of the request this thread serves (if any)."""
    record = current()
    if record is not None:
        record.stages_ms.update(times)
