"""Which fields a request body may hold, by one rule for every route (/query, /internal/answer and the
OpenAI routes): a field is read; or accepted only at a value that asks for what the service does
anyway (`no_op`: `n` 1, `logprobs` false ...); or accepted and not acted on because it cannot change
the answer (`ignored`: `user`, `metadata` ...), which is logged by name (never by value: ids and tags
are the caller's). Any other field is a 400 naming it: the service does not drop in silence what it
would not act on. A field sent as null counts as not sent.
"""
from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.server.errors import ApiError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FieldRules:
    """A route's fields: those it reads, those it accepts at a no-op value ((the values, why)) and those
    it accepts and ignores (why)."""
    read: Collection[str]
    no_op: Mapping[str, tuple[tuple[Any, ...], str]] = field(default_factory=dict)
    ignored: Mapping[str, str] = field(default_factory=dict)
    ignore_others: bool = False  # every field not read nor a no-op is ignored (an options object's)

    def check(self, body: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        """The body's fields sent (not null), each read, a no-op or ignored; else an ApiError 400 naming
        it (`prefix`: where the body sits in the request, as `stream_options.`)."""
        sent = {key: value for key, value in body.items() if value is not None}
        ignored = []
        for key, value in sent.items():
            if key in self.read:
                continue
            if key in self.ignored or (self.ignore_others and key not in self.no_op):
                ignored.append(key)
                continue
            if key not in self.no_op:
                accepted = f" (and accepts without acting on them: {', '.join(self.ignored)})" if self.ignored else ""
                raise ApiError(400, f"'{prefix}{key}' is not supported: it is not a field the service acts on, and "
                                    "the service does not ignore what could change the answer; it reads "
                                    f"{', '.join(self.read)}{accepted}", field=f"{prefix}{key}",
                               code="unsupported_parameter")
            values, why = self.no_op[key]
            if not any(_same(value, v) for v in values):
                raise ApiError(400, f"'{prefix}{key}' = {value!r} is not supported: {why}; send {values[0]!r} or "
                                    "leave it out", field=f"{prefix}{key}", code="unsupported_value")
        if ignored:
            log.info("accepted and not acted on: %s", ", ".join(f"{prefix}{key}" for key in ignored))
        return sent


def _same(value: object, allowed: object) -> bool:
    """Equal, as JSON means it: 0 and 0.0 are one number; false is no number."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (value, allowed))
    return value == allowed and (numbers or type(value) is type(allowed))
