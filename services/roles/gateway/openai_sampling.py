"""A /v1 chat body's decoding parameters: temperature, top_p, top_k, seed and stop, as one Sampling.

`temperature` absent gets OPENAI_DEFAULT_TEMPERATURE. A sampled request (temperature > 0) that
sends no `seed` gets one drawn here; the response returns it (its `seed` extension field), so
the client can ask for the same answer again. `presence_penalty` and `frequency_penalty` other
than 0 are refused (400): the model's own repetition penalty applies to every answer, and an
OpenAI-style additive penalty on top of it would be a second, different knob for the same thing.
"""
from __future__ import annotations

import secrets

from pipeline.sampling_params import MAX_SEED, Sampling, SamplingError, stop_strings
from services.roles.gateway.openai_api import OpenAIError

PENALTIES = ("presence_penalty", "frequency_penalty")


def parse_sampling(body: dict, default_temperature: float) -> Sampling:
    """The body's Sampling (a drawn seed where it samples without one), or the OpenAIError (400) naming the field."""
    for key in PENALTIES:
        value = body.get(key)
        if value is not None and value != 0:
            raise OpenAIError(400, f"'{key}' = {value!r} is not supported: the model's own repetition penalty "
                                   "applies to every answer; send 0 or leave it out", key, code="unsupported_value")
    try:
        temperature = _number(body, "temperature", default_temperature)
        top_p = _number(body, "top_p", 1.0)
        top_k = body.get("top_k", 0)
        if top_k is None:
            top_k = 0
        if type(top_k) is not int:
            raise SamplingError("top_k", "'top_k' must be an integer")
        seed = body.get("seed")
        if seed is not None and type(seed) is not int:
            raise SamplingError("seed", "'seed' must be an integer")
        if seed is None and temperature > 0:
            seed = secrets.randbelow(MAX_SEED + 1)
        return Sampling(temperature, top_p, top_k, seed, stop_strings(body.get("stop")))
    except SamplingError as exc:
        raise OpenAIError(400, str(exc), exc.field, code="invalid_value") from None


def _number(body: dict, key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingError(key, f"'{key}' must be a number, got {type(value).__name__}")
    return float(value)
