"""How a stage that counts tokens sizes its batches: each item's cost given on submit, and a batch's
padded tokens from its items' costs (TEI's token budget)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class BatchTokens(Enum):
    """How a batch's tokens follow from its items' costs."""

    # One forward padded to the longest item: items x the longest (embedder, classifiers).
    PADDED = "padded"
    # Each item's cost already counts its own padding (a rerank request's pairs): the sum. The
    # batch's pairs are regrouped by length together, so it runs within max_pad_ratio of that.
    SUMMED = "summed"

    def tokens_of(self, shape: BatchShape) -> int:
        return shape.count * shape.longest if self is BatchTokens.PADDED else shape.total

    def batch_tokens(self, costs: list[int]) -> int:
        return self.tokens_of(BatchShape(len(costs), max(costs, default=0), sum(costs)))


@dataclass(frozen=True)
class BatchShape:
    """What a batch's tokens depend on: its items, the longest one's cost, all their costs."""

    count: int = 0
    longest: int = 0
    total: int = 0

    def plus(self, cost: int) -> BatchShape:
        return BatchShape(self.count + 1, max(self.longest, cost), self.total + cost)


@dataclass(frozen=True)
class TokenPolicy:
    """A stage that counts its items' tokens: each item's cost is given on submit, and with
    ``max_tokens`` a batch closes before the next item would take it over that many tokens."""

    counting: BatchTokens
    max_tokens: int | None = None  # None: counted and reported, never closing a batch

    def tokens_of(self, shape: BatchShape) -> int:
        return self.counting.tokens_of(shape)

    def fits(self, shape: BatchShape, cost: int) -> bool:
        """Whether one more item of `cost` keeps a batch of `shape` within the budget; an empty
        batch takes any item, so one over the budget runs alone (never starved)."""
        return self.max_tokens is None or shape.count == 0 or self.tokens_of(shape.plus(cost)) <= self.max_tokens

    def over(self, shape: BatchShape) -> bool:
        """Whether a batch of `shape` is over the budget (only ever one item alone)."""
        return self.max_tokens is not None and self.tokens_of(shape) > self.max_tokens
