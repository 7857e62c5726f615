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
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline import spec

ROLES = ("user", "assistant")  # the roles of an earlier turn
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
    """An earlier turn of the conversation: its role (`user` or `assistant`) and its text."""
    role: str
    content: str

    def message(self) -> dict:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Conversation:
    """What a request adds to the contract's prompt: earlier turns, oldest first, and the client's
    instructions (its system messages), if any."""
    history: tuple[Turn, ...] = ()
    instructions: str | None = None

    def __bool__(self) -> bool:
        return bool(self.history) or self.instructions is not None


NONE = Conversation()  # a request without history or instructions


@dataclass(frozen=True)
class Fitted:
    """A conversation within its token budget, and how many of its oldest turns were dropped."""
    conversation: Conversation
    dropped: int


def fit(conversation: Conversation, count_tokens: Callable[[str], int], budget: int) -> Fitted:
    """The newest turns whose tokens (content plus TURN_FRAME_TOKENS each) fit in what `budget` leaves
    after the instructions' tokens; every older turn is dropped (a kept history has no gaps)."""
    left = budget - (count_tokens(conversation.instructions) if conversation.instructions is not None else 0)
    kept = 0
    for turn in reversed(conversation.history):
        left -= count_tokens(turn.content) + TURN_FRAME_TOKENS
        if left < 0:
            break
        kept += 1
    history = conversation.history[len(conversation.history) - kept:]
    return Fitted(Conversation(history, conversation.instructions), len(conversation.history) - kept)


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
            *(turn.message() for turn in conversation.history), question]
