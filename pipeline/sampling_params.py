"""How one request's tokens are chosen: temperature, top_p, top_k, seed and stop strings.

Plain data, no torch: a worker builds it from its request (services/server/answer_request.py
reads the fields from a /v1 body by the same limits) and the continuous engine decodes with it
(pipeline/continuous/sampling.py). `GREEDY` (temperature 0) is what
/query always gets. A sampled request's random stream is its own, seeded from `seed`: its
tokens depend only on its own logits and that seed, never on its batch-mates.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_STOP_STRINGS = 4  # as OpenAI's API allows
MAX_STOP_CHARS = 64  # longest stop string accepted
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a 64-bit integer
MAX_TOP_LOGPROBS = 20  # as OpenAI's API allows


class SamplingError(ValueError):
    """A field out of its rule: `field` names it, the message says the rule."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy (argmax); top_p, top_k and seed then change nothing
    top_p: float = 1.0  # the smallest set of tokens whose probability reaches top_p
    top_k: int = 0  # the k most probable tokens; 0 (or -1, as vLLM writes it): all
    seed: int | None = None  # the random stream's seed; required when temperature > 0
    stop: tuple[str, ...] = ()  # the answer ends before the first of these; they are not returned
    # Each new token's log probability, with this many most likely alternatives (0 to MAX_TOP_LOGPROBS);
    # None: none. They change no token.
    logprobs: int | None = None

    def __post_init__(self) -> None:
        check(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def check(sampling: Sampling) -> None:
    """SamplingError where a field breaks its rule."""
    if not 0.0 <= sampling.temperature <= 2.0:
        raise SamplingError("temperature", f"'temperature' is {sampling.temperature}; it must be from 0 to 2")
    if not 0.0 < sampling.top_p <= 1.0:
        raise SamplingError("top_p", f"'top_p' is {sampling.top_p}; it must be over 0 and at most 1")
    if sampling.top_k < -1:
        raise SamplingError("top_k", f"'top_k' is {sampling.top_k}; it must be -1 or 0 (all tokens) or at least 1")
    if sampling.seed is not None and not -MAX_SEED - 1 <= sampling.seed <= MAX_SEED:
        raise SamplingError("seed", "'seed' must fit in a signed 64-bit integer")
    if not sampling.greedy and sampling.seed is None:
        raise SamplingError("seed", "a sampled request (temperature > 0) needs its seed")
    stop_strings(list(sampling.stop))
    if sampling.logprobs is not None and not 0 <= sampling.logprobs <= MAX_TOP_LOGPROBS:
        raise SamplingError("top_logprobs", f"'top_logprobs' is {sampling.logprobs}; it must be from 0 to "
                                            f"{MAX_TOP_LOGPROBS}")


def stop_strings(value: object) -> tuple[str, ...]:
    """OpenAI's `stop`: null, one string or a list of up to MAX_STOP_STRINGS non-empty strings."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise SamplingError("stop", "'stop' must be a string or an array of strings")
    if len(items) > MAX_STOP_STRINGS:
        raise SamplingError("stop", f"'stop' has {len(items)} strings; at most {MAX_STOP_STRINGS} are allowed")
    if any(not s or len(s) > MAX_STOP_CHARS for s in items):
        raise SamplingError("stop", f"each 'stop' string must have 1 to {MAX_STOP_CHARS} characters")
    return tuple(items)


GREEDY = Sampling()
