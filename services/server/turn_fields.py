"""A conversation's body fields, each read by its rule: turns (an assistant's with its tool calls) and
function tools. A field out of its rule is an ApiError 400 naming it (`history[1].tool_calls[0]`)
and the rule. services/server/answer_request.py reads them into the one request.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pipeline.conversation import ROLES, Turn
from pipeline.tool_calls import ToolCall
from services.server.errors import ApiError

MAX_TOOLS = 128  # function tools a request may offer


def turns(body: Mapping[str, Any], name: str) -> tuple[Turn, ...]:
    """The body's turns under `name`: [{"role": one of ROLES, "content": string, an assistant's
    optional "tool_calls"}], in order."""
    value = body.get(name)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ApiError(400, f"'{name}' must be an array of turns, each {{\"role\": one of {', '.join(ROLES)}, "
                            "\"content\": string}, oldest first", field=name)
    read = []
    for i, turn in enumerate(value):
        field = f"{name}[{i}]"
        if not isinstance(turn, dict):
            raise ApiError(400, f"'{field}' must be an object with 'role' and 'content'", field=field)
        extra = [key for key in turn if key not in ("role", "content", "tool_calls")]
        if extra:
            raise ApiError(400, f"'{field}.{extra[0]}' is not a field of a turn: a turn is its role and content "
                                "(and an assistant's tool_calls)", field=f"{field}.{extra[0]}")
        if turn.get("role") not in ROLES:
            raise ApiError(400, f"'{field}.role' must be one of {', '.join(ROLES)}", field=f"{field}.role")
        if not isinstance(turn.get("content"), str):
            raise ApiError(400, f"'{field}.content' must be a string", field=f"{field}.content")
        check_unicode(turn["content"], f"{field}.content")
        calls = _calls(turn.get("tool_calls"), f"{field}.tool_calls", turn["role"])
        read.append(Turn(turn["role"], turn["content"], calls))
    return tuple(read)


def _calls(value: object, field: str, role: str) -> tuple[ToolCall, ...]:
    """An assistant turn's calls: [{"name": non-empty string, "arguments": JSON text of an object}]."""
    if value is None:
        return ()
    if role != "assistant":
        raise ApiError(400, f"'{field}' is an assistant turn's field only", field=field)
    if not isinstance(value, list):
        raise ApiError(400, f"'{field}' must be an array of {{\"name\", \"arguments\"}} objects", field=field)
    calls = []
    for i, call in enumerate(value):
        if not isinstance(call, dict) or set(call) != {"name", "arguments"} or not isinstance(call["name"], str) \
                or not call["name"] or not isinstance(call["arguments"], str):
            raise ApiError(400, f"'{field}[{i}]' must be {{\"name\": non-empty string, \"arguments\": string}}",
                           field=f"{field}[{i}]")
        arguments = _arguments(call["arguments"], f"{field}[{i}].arguments")
        check_unicode(call["name"], f"{field}[{i}].name")
        calls.append(ToolCall(call["name"], json.dumps(arguments, ensure_ascii=False)))
    return tuple(calls)


def _arguments(text: str, field: str) -> dict:
    """A call's arguments: JSON text of an object (the template renders them as one)."""
    try:
        value = json.loads(text)
    except ValueError:
        raise ApiError(400, f"'{field}' must be JSON text of an object", field=field) from None
    if not isinstance(value, dict):
        raise ApiError(400, f"'{field}' must be JSON text of an object, got {type(value).__name__}", field=field)
    return value


def function_tools(value: object) -> tuple[dict, ...]:
    """The function tools offered: [{"type": "function", "function": {"name": non-empty string, ...}}],
    at most MAX_TOOLS, their names unique; each is rendered as sent (its JSON, as text)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise ApiError(400, f"'tools' must be an array of at most {MAX_TOOLS} function tools", field="tools")
    names = set()
    for i, tool in enumerate(value):
        field = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise ApiError(400, f"'{field}' must be {{\"type\": \"function\", \"function\": {{...}}}}", field=field)
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(400, f"'{field}.function.name' must be a non-empty string", field=f"{field}.function.name")
        if name in names:
            raise ApiError(400, f"'{field}.function.name' {name!r} names an earlier tool too; names are unique",
                           field=f"{field}.function.name")
        names.add(name)
        try:
            json.dumps(tool, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, f"'{field}' must be valid Unicode text (it holds a lone surrogate)", field=field) from None
    return tuple(value)


def check_unicode(text: str, field: str) -> None:
    """JSON can spell lone surrogates ("\\ud800"); no tokenizer, log or forward could carry them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"'{field}' must be valid Unicode text (it holds a lone surrogate)", field=field) from None
