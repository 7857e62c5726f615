"""OpenAI's function tools on /v1/chat/completions: which tools the model is shown, and its calls in
OpenAI's response shapes.

`tool_choice` is honoured by what the model is shown, as far as greedy decoding can honour it:
- absent or "auto": every tool is rendered (Qwen2.5's template), and the model's calls are read;
- "none": no tool is rendered and no call is read (a `<tool_call>` the model writes anyway is text);
- a named function ({"type": "function", "function": {"name": ...}}): only that tool is rendered. The
  model is not forced to call it (no constrained decoding): it may answer in text instead.
- "required" cannot be honoured without constrained decoding: a 400 naming it.
A call's `id` (`call_` and 24 hex digits) is made here, where the call becomes OpenAI's.
"""
from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pipeline.tool_calls import ToolCall
from services.server.errors import ApiError


def shown_tools(tools: object, tool_choice: object) -> tuple[dict, ...]:
    """The tools the model is shown, as `tool_choice` says (each tool itself is checked where the
    request is read: services/server/answer_request.py)."""
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, "'tools' must be an array of function tools", field="tools")
    offered = tuple(tools or ())
    if tool_choice is None or tool_choice == "auto":
        return offered
    if tool_choice == "none":
        return ()
    if tool_choice == "required":
        raise ApiError(400, "'tool_choice' = 'required' is not supported: greedy decoding without constrained "
                            "decoding cannot force a call (send 'auto', 'none' or a named function)",
                       field="tool_choice", code="unsupported_value")
    name = _named(tool_choice)
    chosen = tuple(tool for tool in offered
                   if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
                   and tool["function"].get("name") == name)
    if not chosen:
        raise ApiError(400, f"'tool_choice' names the function {name!r}, which is not among 'tools'",
                       field="tool_choice")
    return chosen


def _named(tool_choice: object) -> str:
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or not isinstance(name, str):
        raise ApiError(400, "'tool_choice' must be 'auto', 'none' or {\"type\": \"function\", \"function\": "
                            "{\"name\": ...}}", field="tool_choice")
    return name


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def message_tool_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """The answer's calls (name, arguments) as a message's `tool_calls`."""
    return [{"id": call_id(), "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls]
