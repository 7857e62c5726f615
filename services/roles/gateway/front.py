"""What node 0's routes (/query, /v1/...) share: the node's readiness, the one request parser and
the gateway. Each route reads its body, makes one AnswerRequest and gets one answer stream."""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.config.sections import LimitsSettings
from services.roles.gateway.gateway import Gateway
from services.roles.loaded import Loaded
from services.server.answer_request import ALL_FIELDS, AnswerRequest, Bounds, read_request
from services.server.body import read_json_object
from services.server.lifecycle import Lifecycle
from services.server.stream_response import AnswerStream


@dataclass(frozen=True)
class Front:
    lifecycle: Lifecycle
    limits: LimitsSettings
    bounds: Bounds  # the request rules' limits and the query's token count
    gateway: Loaded[Gateway]

    def body(self) -> dict:
        """The request's JSON body, once the node is ready (else NodeNotReady: 503 + Retry-After)."""
        self.lifecycle.require_ready()
        return read_json_object(self.limits.max_body_bytes)

    def request(self, fields: Mapping[str, Any], accepted: Collection[str] = ALL_FIELDS) -> AnswerRequest:
        """The AnswerRequest of a body's fields (services.server.answer_request's rules)."""
        return read_request(fields, self.bounds, accepted)

    def answer(self, request: AnswerRequest) -> AnswerStream:
        """The request's answer stream through the gateway, within REQUEST_TIMEOUT_S."""
        return self.gateway.require().answer(request, self.limits.request_timeout_s)
