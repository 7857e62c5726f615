"""Qwen2.5's tool calls in generated output: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Qwen2.5 writes a call between its `<tool_call>` and `</tool_call>` added tokens, a JSON object of the
function's name and its arguments (the format its chat template asks for). Only those token ids mark a
call: the same characters spelled by ordinary tokens (a user's text, or a prompt's, which is always
encoded as text: pipeline/prompt_tokens.py) are text. The output processor (pipeline/continuous/output.py) holds a call's
tokens back from the answer's text and reads them here: as they come (`CallReader`: the name, then the
arguments' characters as the model writes them, for a stream's deltas), and whole at `</tool_call>`
(`parse_call`).

A call's `arguments` are the JSON text the model wrote, so its streamed pieces joined are its
arguments. They stream only in Qwen's own order (`{"name": ..., "arguments": {` first); a call written
otherwise is given whole when it closes. A call cut off by the token cap (or one whose body turns out
not to parse) becomes text in the answer, after the deltas it had streamed: as OpenAI's own stream,
whose arguments cut by max_tokens are no JSON either.
"""
from __future__ import annotations

import json
import re
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


@dataclass(frozen=True)
class ToolCallDelta:
    """The next part of one call as it is generated: its function's name (on the call's first delta
    only) and the next characters of its arguments."""
    index: int  # the call's place among the answer's calls
    name: str | None = None
    arguments: str = ""


# Qwen2.5's order: the name, then the arguments object. Group 1: the name as JSON string content.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


class CallReader:
    """One call's body read as it grows: its name once the head is written, then each character of its
    arguments object as it comes, up to the brace that closes it (a JSON scan: strings, escapes, depth)."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.arguments = ""  # the arguments' characters read so far
        self.complete = False  # the arguments object has closed
        self._at: int | None = None  # where in the body the arguments start
        self._depth = 0
        self._in_string = self._escaped = False

    def read(self, body: str) -> tuple[str | None, str]:
        """The name, where this body is the first to hold it, and the arguments' characters new in it.
        `body`: the call's text so far (a trailing U+FFFD, half a character, is not read yet)."""
        body = body.rstrip("\ufffd")
        named = None
        if self._at is None:
            head = _HEAD.match(body)
            if head is None or head.end() == len(body):  # the arguments' first character is not written yet
                return None, ""
            if body[head.end()] != "{":  # arguments that are no object: no call (parse_call), nothing streamed
                self._at, self.complete = len(body), True
                return None, ""
            try:
                self.name = named = json.loads(f'"{head.group(1)}"')
            except ValueError:
                return None, ""
            self._at = head.end()
        new = []
        for ch in body[self._at + len(self.arguments):]:
            if self.complete:
                break  # past the object
            new.append(ch)
            if self._in_string:
                self._escaped, self._in_string = (False, True) if self._escaped else (ch == "\\", ch != '"')
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                self.complete = self._depth == 0
        piece = "".join(new)
        self.arguments += piece
        return named, piece


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
    reader = CallReader()
    reader.read(text)
    # The model's own text where it reads as these arguments (what a stream gave), else the object's JSON.
    if reader.complete and reader.name == value["name"] and _loads(reader.arguments) == arguments:
        return ToolCall(value["name"], reader.arguments)
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None
