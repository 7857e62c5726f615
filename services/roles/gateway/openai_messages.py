"""A chat's `messages` as the service reads them (pipeline/conversation.py): the last message, a
user's, is the question; the user and assistant messages before it are the history; system (and
developer) messages are the client's instructions, added after the service's system prompt. A
message's content is a string or an array of text parts. What the service would not act on (another
role, another key of a message, another kind of part) is a 400 naming the message's field."""
from __future__ import annotations

from pipeline import spec
from services.server.errors import ApiError

# The message roles that carry the client's instructions, and those of a conversation's turns.
SYSTEM_ROLES = ("system", "developer")
TURN_ROLES = ("user", "assistant")


def _invalid(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, field=param, code=code)


def _unsupported_value(param: str, value: object, allowed: str) -> ApiError:
    return _invalid(f"'{param}' = {value!r} is not supported: {allowed}", param, "unsupported_value")


def chat_conversation(messages: object) -> tuple[str, tuple[dict, ...], str | None]:
    """The question (the last message, a user's), the earlier user and assistant turns as the
    service's `history`, and the system (or developer) messages' text as the client's instructions,
    joined by blank lines; a system message that is the contract's own system prompt adds nothing."""
    if messages is None:
        raise _invalid("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("'messages' must be a non-empty array of messages", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _invalid(f"'messages[{i}]' must be an object with a string 'role'", f"messages[{i}]")
        extra = [key for key, value in message.items() if key not in ("role", "content") and value is not None]
        if extra:
            raise _invalid(f"'messages[{i}].{extra[0]}' is not supported: a message is its role and content",
                           f"messages[{i}].{extra[0]}", "unsupported_parameter")
    last = len(messages) - 1
    if messages[last]["role"] != "user":
        raise _invalid(f"the last message must have role 'user' (it is the question), got {messages[last]['role']!r}",
                       f"messages[{last}].role")
    history: list[dict] = []
    instructions: list[str] = []
    for i, message in enumerate(messages[:last]):
        role, content = message["role"], _text(message.get("content"), f"messages[{i}].content")
        if role in SYSTEM_ROLES:
            if content != spec.SYSTEM_PROMPT:
                instructions.append(content)
        elif role in TURN_ROLES:
            history.append({"role": role, "content": content})
        else:
            raise _unsupported_value(f"messages[{i}].role", role,
                                     f"a message's role is one of {', '.join((*SYSTEM_ROLES, *TURN_ROLES))}")
    query = _text(messages[last].get("content"), f"messages[{last}].content")
    if not query.strip():
        raise _invalid("the last user message must not be empty", f"messages[{last}].content")
    return query, tuple(history), "\n\n".join(instructions) if instructions else None


def _text(content: object, param: str) -> str:
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
