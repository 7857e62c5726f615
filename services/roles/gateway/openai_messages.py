"""A chat's `messages` as the service reads them (pipeline/conversation.py): the latest user message
is the question; the user, assistant and tool messages before it are the history; the assistant's
tool calls and the tools' results after it (a tool round: the last message is then a tool's) follow
the question; system (and developer) messages are the client's instructions, added after the
service's system prompt. A message's content is a string or an array of text parts; an assistant's
`tool_calls` are OpenAI's function calls, their arguments JSON text of an object. What the service
would not act on (another role, another key of a message, another kind of part) is a 400 naming the
message's field. A tool message's `tool_call_id` (and `name`) is accepted and not rendered: Qwen2.5's
template matches results to calls by their order.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from pipeline import spec
from services.server.errors import ApiError

# The message roles that carry the client's instructions, and those of a conversation's turns.
SYSTEM_ROLES = ("system", "developer")
TURN_ROLES = ("user", "assistant", "tool")
# The keys each role's message may have besides role and content.
MESSAGE_KEYS = {"assistant": ("tool_calls",), "tool": ("tool_call_id", "name")}


@dataclass(frozen=True)
class Chat:
    """A chat's messages as the service's request fields (turns as a request body carries them)."""
    query: str
    history: tuple[dict, ...]
    instructions: str | None
    tool_round: tuple[dict, ...]


def _invalid(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, field=param, code=code)


def _unsupported_value(param: str, value: object, allowed: str) -> ApiError:
    return _invalid(f"'{param}' = {value!r} is not supported: {allowed}", param, "unsupported_value")


def chat_conversation(messages: object) -> Chat:
    """The question (the latest user message), the turns before it as the service's `history`, the tool
    round after it, and the system (or developer) messages' text as the client's instructions, joined by
    blank lines; a system message that is the contract's own system prompt adds nothing."""
    if messages is None:
        raise _invalid("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("'messages' must be a non-empty array of messages", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _invalid(f"'messages[{i}]' must be an object with a string 'role'", f"messages[{i}]")
        allowed = ("role", "content", *MESSAGE_KEYS.get(message["role"], ()))
        extra = [key for key, value in message.items() if key not in allowed and value is not None]
        if extra:
            raise _invalid(f"'messages[{i}].{extra[0]}' is not supported: a message is its role and content "
                           "(an assistant's also its tool_calls, a tool's its tool_call_id)",
                           f"messages[{i}].{extra[0]}", "unsupported_parameter")
    last = len(messages) - 1
    if messages[last]["role"] not in ("user", "tool"):
        raise _invalid("the last message must have role 'user' (the question) or 'tool' (a tool's result), "
                       f"got {messages[last]['role']!r}", f"messages[{last}].role")
    asked = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if asked is None:
        raise _invalid("the messages must hold a user message (the question)", "messages")
    history: list[dict] = []
    instructions: list[str] = []
    tool_round: list[dict] = []
    for i, message in enumerate(messages):
        if i == asked:
            continue
        role = message["role"]
        if role in SYSTEM_ROLES:
            content = message_text(message.get("content"), f"messages[{i}].content")
            if content != spec.SYSTEM_PROMPT:
                instructions.append(content)
        elif role in TURN_ROLES:
            (history if i < asked else tool_round).append(_turn(message, i))
        else:
            raise _unsupported_value(f"messages[{i}].role", role,
                                     f"a message's role is one of {', '.join((*SYSTEM_ROLES, *TURN_ROLES))}")
    query = message_text(messages[asked].get("content"), f"messages[{asked}].content")
    if not query.strip():
        raise _invalid("the last user message must not be empty", f"messages[{asked}].content")
    return Chat(query, tuple(history), "\n\n".join(instructions) if instructions else None, tuple(tool_round))


def _turn(message: dict, i: int) -> dict:
    """A user, assistant or tool message as a turn; an assistant's content may be null beside its calls."""
    calls = message.get("tool_calls")
    content = message.get("content")
    if message["role"] == "assistant" and calls is not None and content is None:
        content = ""
    turn = {"role": message["role"], "content": message_text(content, f"messages[{i}].content")}
    if calls is not None:
        turn["tool_calls"] = _calls(calls, f"messages[{i}].tool_calls")
    return turn


def _calls(calls: object, param: str) -> list[dict]:
    """OpenAI's function calls ({"id", "type": "function", "function": {"name", "arguments"}}) as a turn's."""
    if not isinstance(calls, list):
        raise _invalid(f"'{param}' must be an array of tool calls", param)
    turns = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or call.get("type", "function") != "function" or not isinstance(function, dict):
            raise _invalid(f"'{param}[{j}]' must be {{\"type\": \"function\", \"function\": {{\"name\", "
                           "\"arguments\"}}", f"{param}[{j}]")
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not name:
            raise _invalid(f"'{param}[{j}].function.name' must be a non-empty string", f"{param}[{j}].function.name")
        if not isinstance(arguments, str):
            raise _invalid(f"'{param}[{j}].function.arguments' must be a string (JSON text of an object)",
                           f"{param}[{j}].function.arguments")
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise _invalid(f"'{param}[{j}].function.arguments' must be JSON text of an object",
                           f"{param}[{j}].function.arguments")
        turns.append({"name": name, "arguments": arguments})
    return turns


def message_text(content: object, param: str) -> str:
    """A message's content as text: a string, or a list of text parts joined by newlines; valid Unicode."""
    text = _joined(content, param)
    try:  # JSON can spell lone surrogates ("\\ud800"); no tokenizer, log or forward could carry them
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(f"'{param}' must be valid Unicode text (it holds a lone surrogate)", param) from None
    return text


def _joined(content: object, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid(f"'{param}' must be a string or an array of text parts", param)
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise _unsupported_value(f"{param}[{i}]", kind, "only text parts ({'type': 'text', 'text': ...}) are")
        texts.append(part["text"])
    return "\n".join(texts)
