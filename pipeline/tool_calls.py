"""Qwen2.5's tool calls in generated output: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Qwen2.5 writes a call between its `<tool_call>` and `</tool_call>` added tokens, a JSON object of the
function's name and its arguments (the format its chat template asks for). Only those token ids mark a
call: the same characters spelled by ordinary tokens (a user's text, or a prompt's, which is always
encoded as text: pipeline/prompt_tokens.py) are text. The output processor (pipeline/continuous/output.py) holds a call's
tokens back from the answer's text and reads them here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCallTokens:
    """The ids of the tokens that open and close a call (the tokenizer's added tokens)."""
    open_id: int
    close_id: int


@dataclass(frozen=True)
class ToolCall:
    """One function call: the function's name and its arguments as JSON text (an object), as OpenAI's
    `function.arguments` carries them."""
    name: str
    arguments: str

    def as_dict(self) -> dict:
        return {"name": self.name, "arguments": self.arguments}


def parse_call(text: str) -> ToolCall | None:
    """The call a `<tool_call>` body holds (its decoded text), or None where it is not one: not a JSON
    object, or without a non-empty string `name`, or with `arguments` that are not an object."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))
