"""The runner's token choice per row: the model's repetition penalty, then greedy, or sampled from the row's own
random stream.

The penalty is transformers' RepetitionPenaltyLogitsProcessor over each row's seen tokens (gather, penalize,
scatter on a float copy, all rows at once). Where every row is greedy without log probabilities, the logits are
on the CPU and pipeline.kernels.greedy_choice is built, one C++ pass a row does the penalty and the argmax
instead, the same tokens without the float copy.

A sampled row (temperature > 0) scales its logits by 1/temperature, keeps its top_k and then its
top_p nucleus, and draws with torch.multinomial from a torch.Generator of its sequence's own (held in its slot),
seeded with the request's seed. Every operation reads one row, so the same request with the same seed gets
the same tokens alone or in any batch.

A row whose sampling asks for log probabilities gets its chosen token's (and its top alternatives')
from the log-softmax of its own logits row, as the token was chosen from them: after the model's
repetition penalty, before temperature, top_k and top_p (which change how a token is drawn, not the
model's distribution). One row at a time, so they are as batch-invariant as the tokens. They are left
on the row (`SlotRow.logprob`) for the engine to hand to the sequence's reader.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pipeline.sampling_params import Sampling


@dataclass(frozen=True)
class TokenLogprob:
    """One chosen token's log probability and the most likely tokens' (id, log probability), best first."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


# A vocabulary is searched in blocks of this many logits (the last one shorter where the size is not a
# multiple): the largest of each block by amax, then argmax within the first block holding the row's largest.
_ARGMAX_BLOCK = 1024


def first_argmax(logits):
    """`logits.argmax(dim=-1)` of (rows, vocab) floats, the same indices (the first largest; the first NaN where
    a row has one): torch's CPU argmax over a row of a whole vocabulary is several times slower than its
    vectorized amax, so the vocabulary is reduced by amax in blocks and argmax runs over one block a row."""
    import torch
    rows, vocab = logits.shape
    size = _ARGMAX_BLOCK
    whole = vocab // size * size
    if whole < 2 * size or logits.stride(-1) != 1 or not logits.is_cpu:  # CUDA's argmax is not the cost
        return logits.argmax(dim=-1)
    largest = logits[:, :whole].unflatten(1, (whole // size, size)).amax(dim=-1)  # NaN where a block has one
    if whole < vocab:
        largest = torch.cat([largest, logits[:, whole:].amax(dim=-1, keepdim=True)], dim=1)
    holds = (largest == largest.amax(dim=-1, keepdim=True)) | largest.isnan()
    first = holds.to(torch.uint8).argmax(dim=-1).mul_(size)  # where the first block holding it starts
    # The block's columns; past the last column the last one again, after it: argmax's first hit is real.
    columns = (first[:, None] + torch.arange(size, device=logits.device)).clamp_(max=vocab - 1)
    return logits.gather(1, columns).argmax(dim=-1).add_(first)


def penalized(logits, seen, penalty: float):
    """Float logits (rows, vocab) after transformers' RepetitionPenaltyLogitsProcessor over each row's `seen`
    (rows, k) token ids, repeats allowed, all rows at once: gather, where, scatter. On a float copy, or in place
    where the logits are float32 already (the runner's own)."""
    import torch
    scores = logits.float()
    if penalty != 1.0:
        score = scores.gather(1, seen)
        score = torch.where(score < 0, score * penalty, score / penalty)
        scores.scatter_(1, seen, score)
    return scores


def plain_greedy(row: Any) -> bool:
    """Whether a row (a SlotRow) takes its largest logit and asks for nothing else."""
    sampling: Sampling | None = row.sampling
    return sampling is None or (sampling.greedy and sampling.logprobs is None)


class TokenChooser:
    """Stateless: each row's sampling and random stream live in its slot (pipeline.continuous.slots.SlotRow)."""

    def __init__(self, repetition_penalty: float = 1.0):
        import torch

        from pipeline.kernels.greedy_choice import EXTENSION
        self.torch, self.greedy_choice = torch, EXTENSION
        self.repetition_penalty = float(repetition_penalty)

    def choose(self, logits, seen, rows: Sequence[Any]) -> list[int]:
        """One token per row of logits (rows, vocab) after the repetition penalty over `seen` (rows, k) token
        ids (repeats allowed), row i chosen as rows[i] (a SlotRow: its `sampling` and `stream`) says; rows past
        len(rows) are greedy."""
        if (logits.is_cpu and logits.dtype in (self.torch.float32, self.torch.bfloat16) and logits.stride(-1) == 1
                and all(plain_greedy(row) for row in rows)
                and (greedy_tokens := self.greedy_choice.registered("greedy_tokens")) is not None):
            return greedy_tokens(logits, seen, self.repetition_penalty).tolist()
        logits = penalized(logits, seen, self.repetition_penalty)
        tokens = first_argmax(logits).tolist()
        for i, row in enumerate(rows):
            sampling: Sampling | None = row.sampling
            if sampling is not None and not sampling.greedy:
                tokens[i] = self._sample(logits[i], sampling, row.stream)
            if sampling is not None and sampling.logprobs is not None:
                row.logprob = self._logprob(logits[i], tokens[i], sampling.logprobs)
        return tokens

    def _logprob(self, row, token: int, top: int) -> TokenLogprob:
        logprobs = self.torch.log_softmax(row.float(), dim=-1)
        best = self.torch.topk(logprobs, top) if top else None
        alternatives = tuple(zip(best.indices.tolist(), best.values.tolist())) if best is not None else ()
        return TokenLogprob(token, float(logprobs[token]), alternatives)

    def _sample(self, row, sampling: Sampling, stream) -> int:
        torch = self.torch
        scores = row.float() / sampling.temperature
        if 0 < sampling.top_k < scores.shape[-1]:
            kth = torch.topk(scores, sampling.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if sampling.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True)
            probs = ordered.softmax(dim=-1)
            # A token is dropped when the tokens before it already reach top_p; the first always stays.
            drop = (probs.cumsum(dim=-1) - probs) >= sampling.top_p
            scores = scores.scatter(0, order, ordered.masked_fill(drop, float("-inf")))
        probs = scores.softmax(dim=-1)
        return int(torch.multinomial(probs, 1, generator=stream)[0])
