"""services/roles/gateway/openai_sampling.py: a /v1 body's temperature, top_p, top_k, seed and stop."""
from __future__ import annotations

import pytest

from pipeline.sampling_params import GREEDY, Sampling
from services.roles.gateway.openai_api import OpenAIError
from services.roles.gateway.openai_sampling import parse_sampling


def test_no_temperature_gets_the_default_and_greedy_needs_no_seed():
    assert parse_sampling({}, 0.0) == GREEDY
    drawn = parse_sampling({}, 0.7)
    assert drawn.temperature == 0.7 and drawn.seed is not None  # drawn, to be returned to the client
    assert parse_sampling({"temperature": None, "seed": None, "top_k": None}, 0.0) == GREEDY


def test_the_fields_as_sent():
    body = {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "seed": 3, "stop": ["\n\n", "END"],
            "presence_penalty": 0, "frequency_penalty": 0.0}
    assert parse_sampling(body, 0.0) == Sampling(0.8, 0.9, 40, 3, ("\n\n", "END"))
    assert parse_sampling({"stop": "END"}, 0.0).stop == ("END",)


@pytest.mark.parametrize("fields, param", [
    ({"temperature": 2.5}, "temperature"), ({"temperature": "0"}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"top_k": 1.5}, "top_k"), ({"seed": "7"}, "seed"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": 5}, "stop"), ({"presence_penalty": 0.5}, "presence_penalty"), ({"frequency_penalty": -1}, "frequency_penalty"),
])
def test_a_field_out_of_its_rule_is_a_400_naming_it(fields, param):
    with pytest.raises(OpenAIError) as info:
        parse_sampling(fields, 0.0)
    assert info.value.status == 400 and info.value.param == param
