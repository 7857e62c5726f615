"""What node 0's answering routes (/query, /v1/...) share: the edge they enter by, the one request
parser and the gateway. Each route reads its body into one AnswerRequest and gets one answer stream."""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.roles.gateway.gateway import Gateway
from services.roles.loaded import Loaded
from services.server.answer import AnswerStream
from services.server.answer_request import ALL_FIELDS, AnswerRequest, Bounds, read_request
from services.server.deadline import Deadline
from services.server.edge import Edge


@dataclass(frozen=True)
class Front:
    edge: Edge
    bounds: Bounds  # the request rules' limits and the query's token count
    gateway: Loaded[Gateway]

    def request(self, fields: Mapping[str, Any], accepted: Collection[str] = ALL_FIELDS) -> AnswerRequest:
        """The AnswerRequest of a body's fields (services.server.answer_request's rules); a field outside
        `accepted` is refused."""
        return read_request(fields, self.bounds, accepted)

    def answer(self, request: AnswerRequest) -> Callable[[Deadline], AnswerStream]:
        """The request's answer stream through the gateway, by the deadline the edge gives it."""
        return lambda deadline: self.gateway.require().answer(request, deadline)

    def choices(self, requests: Sequence[AnswerRequest], combine: Callable[[list[Callable[[], AnswerStream]]],
                                                                           AnswerStream]) -> Callable[[Deadline], AnswerStream]:
        """n choices' answer streams on one admission slot, combined as `combine` says (merged or collected)."""
        return lambda deadline: self.gateway.require().choices(requests, deadline, combine)
