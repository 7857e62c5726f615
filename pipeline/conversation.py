"""A conversation's part of the prompt: earlier turns, the client's instructions, what retrieval reads.

The prompt of a request with a conversation is the contract's (pipeline/spec.py) with two additions:
the client's instructions follow the service's system prompt in the system message (added, never in
place of it: the grounding stays), and the earlier turns come between the system message and the last
user message, which holds the retrieved passages and the question, as a request without history has it.
So a request without history or instructions has exactly the contract's prompt.

The conversation's share of the prompt is bounded in tokens (`budget`, MAX_HISTORY_TOKENS): the
instructions' tokens, then the newest turns that fit; the older ones are dropped, and the reply says
how many. Retrieval reads the latest user turn; a short one (a follow-up such as "and to Canada?")
is read after the user turns before it (`retrieval_query`).

Tools (OpenAI function tools) are rendered by the model's chat template (Qwen2.5's: in the system
message); an assistant turn may carry the tool calls it made, and a `tool` turn a tool's result. A tool
round after the question (the assistant's calls, then the tools' results) follows the question's
message, as it followed it in the conversation; the model answers after it.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline import spec
from pipeline.tool_calls import ToolCall

ROLES = ("user", "assistant", "tool")  # the roles of an earlier turn
# The tokens a turn takes around its content in Qwen2.5's chat template (ChatML):
# `<|im_start|>`, the role, a newline, then `<|im_end|>` and a newline.
TURN_FRAME_TOKENS = 5
# The default MAX_HISTORY_TOKENS.
HISTORY_TOKENS = 1024
# A latest user turn of fewer words than this is a follow-up: retrieval reads the user turns before
# it too, newest first, until the words read reach this many or FOLLOW_UP_TURNS turns were added.
FOLLOW_UP_WORDS = 6
FOLLOW_UP_TURNS = 2


@dataclass(frozen=True)
class Turn:
    """An earlier turn of the conversation: its role (`user`, `assistant` or `tool`: a tool's result)
    and its text; an assistant turn's tool calls, in order."""
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()

    def message(self) -> dict:
        """The turn as the chat template reads it (a call's arguments an object, as Qwen2.5's renders them)."""
        if not self.tool_calls:
            return {"role": self.role, "content": self.content}
        return {"role": self.role, "content": self.content,
                "tool_calls": [{"type": "function", "function": {"name": call.name,
                                                                 "arguments": json.loads(call.arguments)}}
                               for call in self.tool_calls]}

    def wire(self) -> dict:
        """The turn as a request body carries it (the arguments as JSON text)."""
        if not self.tool_calls:
            return {"role": self.role, "content": self.content}
        return {"role": self.role, "content": self.content,
                "tool_calls": [call.as_dict() for call in self.tool_calls]}

    def text_tokens(self, count_tokens: Callable[[str], int]) -> int:
        """Its content's and its calls' tokens, as text."""
        return count_tokens(self.content) + sum(count_tokens(call.name) + count_tokens(call.arguments)
                                                for call in self.tool_calls)


@dataclass(frozen=True)
class Conversation:
    """What a request adds to the contract's prompt: earlier turns, oldest first, and the client's
    instructions (its system messages), if any."""
    history: tuple[Turn, ...] = ()
    instructions: str | None = None
    # The function tools offered, each as sent ({"type": "function", "function": {...}}), rendered by the template.
    tools: tuple[dict, ...] = ()
    # The tool round after the question: the assistant's turns with calls and the tools' results, in order.
    tool_round: tuple[Turn, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.history) or self.instructions is not None or bool(self.tools) or bool(self.tool_round)

    def fixed_tokens(self, count_tokens: Callable[[str], int]) -> int:
        """The tokens no turn dropping can save: the instructions', the tools' JSON and the tool round's."""
        return ((count_tokens(self.instructions) if self.instructions is not None else 0)
                + sum(count_tokens(tool_json(tool)) for tool in self.tools)
                + sum(turn.text_tokens(count_tokens) + TURN_FRAME_TOKENS for turn in self.tool_round))


NONE = Conversation()  # a request without history or instructions


@dataclass(frozen=True)
class Fitted:
    """A conversation within its token budget, and how many of its oldest turns were dropped."""
    conversation: Conversation
    dropped: int


def fit(conversation: Conversation, count_tokens: Callable[[str], int], budget: int) -> Fitted:
    """The newest turns whose tokens (content and calls plus TURN_FRAME_TOKENS each) fit in what `budget`
    leaves after the fixed tokens (instructions, tools, tool round); every older turn is dropped (a kept
    history has no gaps)."""
    left = budget - conversation.fixed_tokens(count_tokens)
    kept = 0
    for turn in reversed(conversation.history):
        left -= turn.text_tokens(count_tokens) + TURN_FRAME_TOKENS
        if left < 0:
            break
        kept += 1
    history = conversation.history[len(conversation.history) - kept:]
    return Fitted(dataclasses.replace(conversation, history=history), len(conversation.history) - kept)


def retrieval_query(query: str, history: Sequence[Turn]) -> str:
    """What retrieval embeds and reranks by: the latest user turn (`query`); where it has fewer than
    FOLLOW_UP_WORDS words, then the user turns before it, newest first, one a line, while the words
    read are fewer than FOLLOW_UP_WORDS, at most FOLLOW_UP_TURNS of them. The latest turn comes first
    so that the embedder's and reranker's 512-token cut never takes it. Assistant turns are never
    read: the passages are found for what the user asked."""
    lines, words = [query], len(query.split())
    earlier = [turn.content for turn in reversed(history) if turn.role == "user" and turn.content.strip()]
    for text in earlier[:FOLLOW_UP_TURNS]:
        if words >= FOLLOW_UP_WORDS:
            break
        lines.append(text)
        words += len(text.split())
    return "\n".join(lines)


def system_prompt(instructions: str | None) -> str:
    """The service's system prompt, then the client's instructions after a blank line."""
    return spec.SYSTEM_PROMPT if instructions is None else f"{spec.SYSTEM_PROMPT}\n\n{instructions}"


def build_messages(query: str, ranked_docs: Sequence[spec.HasTitleAndContent],
                   conversation: Conversation | None = None) -> list[dict]:
    """The chat messages of the prompt: the contract's, with the conversation's additions."""
    system, question = spec.build_messages(query, ranked_docs)
    if not conversation:
        return [system, question]
    return [{"role": "system", "content": system_prompt(conversation.instructions)},
            *(turn.message() for turn in conversation.history), question,
            *(turn.message() for turn in conversation.tool_round)]


def tool_json(tool: dict) -> str:
    """A tool as the template writes it (transformers' `tojson`: json.dumps, non-ASCII kept)."""
    return json.dumps(tool, ensure_ascii=False)
