"""Incremental detokenization: text pieces as token ids arrive, never half a character.

A byte-level BPE token (Qwen2.5's) may hold part of a UTF-8 character; decoding a prefix of the ids then
ends with U+FFFD where the character is still incomplete. `IncrementalDetokenizer` decodes only a small
window of recent tokens (as vLLM's and TGI's prefix_offset/read_offset detokenizers do) and emits the
part of the window's text that later tokens can no longer change:

* The UTF-8 decoder (Python's and the Rust `tokenizers` one alike) replaces each maximal invalid or
  incomplete byte run by one U+FFFD, so bytes still waiting for their continuation show as exactly one
  trailing U+FFFD and everything before it is final: a window's text is emitted up to that U+FFFD.
* When the window's text ends on a whole character, the decoder's state is clean at that token
  boundary: the window slides forward, keeping `CONTEXT_TOKENS` tokens before the boundary (so a
  tokenizer that drops a leading space on a text's first token still joins pieces right).

Joined, the pieces and `finish()` equal `tokenizer.decode(ids, skip_special_tokens=...)` for tokenizers
whose decode concatenates per-token bytes (byte-level BPE without clean-up of tokenization spaces:
Qwen2.5's). Each push decodes only the tokens since the last whole character plus the context (invalid
UTF-8 keeps the window open until a character completes). One detokenizer per sequence, fed by one
thread; request threads may share the tokenizer when its decode only reads it (pipeline/prompt_tokens.py's
does; a transformers fast tokenizer, whose calls may change its settings, must not be shared).
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

REPLACEMENT = "\ufffd"
# Tokens kept before the window's start so the first one is decoded as it joins its predecessor.
CONTEXT_TOKENS = 4


class Decoder(Protocol):
    """What the detokenizer needs of a Hugging Face tokenizer."""
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ..., **kwargs: Any) -> str: ...


class IncrementalDetokenizer:
    """Turns one sequence's token ids, pushed one at a time, into text pieces."""

    def __init__(self, tokenizer: Decoder, *, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._window: list[int] = []  # the ids whose text is decoded on each push
        self._emitted = 0  # characters of the window's text already given out
        self._count = 0

    @property
    def token_count(self) -> int:
        """How many ids were pushed."""
        return self._count

    def push(self, token_id: int) -> str:
        """The text token_id adds, up to its last whole character; "" when it completes none."""
        self._window.append(int(token_id))
        self._count += 1
        text = self._decode(self._window)
        incomplete = text.endswith(REPLACEMENT)
        final = len(text) - 1 if incomplete else len(text)
        piece = text[self._emitted:final] if final > self._emitted else ""
        self._emitted = max(self._emitted, final)
        if not incomplete and len(self._window) > CONTEXT_TOKENS:
            self._slide()
        return piece

    def finish(self) -> str:
        """The text still held back (a trailing U+FFFD that no token completed); then nothing more."""
        text = self._decode(self._window)
        piece = text[self._emitted:]
        self._emitted = len(text)
        return piece

    def _slide(self) -> None:
        # The window's text ends on a whole character and was all given out: the decoder's state is
        # clean here, so the text of the last few tokens (leading U+FFFDs for continuation bytes
        # whose lead byte is cut off included) is a prefix of every later window's text.
        del self._window[:-CONTEXT_TOKENS]
        self._emitted = len(self._decode(self._window))

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)
