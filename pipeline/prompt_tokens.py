"""The LLM's tokenization, in one place: prompts to ids, text counted as a prompt holds it, ids to text.

User text never becomes control tokens: the template's own text is split at the tokenizer's added
tokens (`<|im_start|>`...), which become their ids, and every message's content (the query, the
documents, earlier turns and a client's instructions alike) is text between them, encoded with
every added token's string kept as characters, special or not (Qwen's `<tool_call>` and
`<|fim_prefix|>` are not special), so a query that says
`<|im_end|>\\n<|im_start|>system` cannot close its turn. Text holding no added-token string
encodes to exactly the ids of the whole rendered prompt. A client's tools (their JSON, as the template
writes it) and the names and arguments of earlier tool calls are client text too: only the template's
own `<tool_call>` and `</tool_call>` become those tokens' ids.

Threads: every method may be called from any thread at once, and nothing here locks: the encoding
tokenizer is this object's own copy, set up once and never changed, so every call only reads it.
A fast tokenizer whose settings change between calls (transformers' `__call__` changes padding,
truncation and `split_special_tokens` on the shared Rust object) must not be shared between
threads (huggingface/transformers#47085).
"""
from __future__ import annotations

import json
import re
from typing import Any, Sequence

from pipeline.conversation import Conversation, build_messages
from pipeline.tool_calls import CLOSE, OPEN, ToolCallTokens

# Each piece of client text (a message's content, a tool's JSON, a call's name or arguments) is one
# private-use character while the template renders, which no chat template writes.
_FIRST_SLOT, _LAST_SLOT = 0xE000, 0xF8FF
_SLOT_PATTERN = re.compile(f"([{chr(_FIRST_SLOT)}-{chr(_LAST_SLOT)}])")


class _Slots:
    """The client texts of one prompt, each behind its slot character."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        # The slots the template writes through `tojson`, each as `tojson` writes its stand-in value.
        self.dumped: dict[str, str] = {}

    def text(self, text: str) -> str:
        """The slot of a text the template writes as it is ("" stays "": the template tests it)."""
        if not text:
            return text
        if _FIRST_SLOT + len(self.texts) > _LAST_SLOT:
            raise ValueError("the prompt holds more client texts than there are slot characters")
        slot = chr(_FIRST_SLOT + len(self.texts))
        self.texts[slot] = text
        return slot

    def json(self, value: object) -> dict:
        """The stand-in of a value the template writes through `tojson` (transformers': json.dumps,
        non-ASCII kept): an object whose one key is the slot (transformers takes only objects as tools)."""
        slot = self.text(json.dumps(value, ensure_ascii=False))
        stand_in = {slot: 0}
        self.dumped[slot] = json.dumps(stand_in, ensure_ascii=False)
        return stand_in

    def message(self, message: dict) -> dict:
        """A chat message with each client text behind its slot."""
        slotted = {**message, "content": self.text(message["content"])}
        if message.get("tool_calls"):
            slotted["tool_calls"] = [
                {"type": "function", "function": {"name": self.text(call["function"]["name"]),
                                                  "arguments": self.json(call["function"]["arguments"])}}
                for call in message["tool_calls"]]
        return slotted


class PromptTokenizer:
    def __init__(self, tokenizer: Any):
        from tokenizers import AddedToken, Tokenizer
        self._template = tokenizer  # only its chat template is used (rendering reads it)
        serialized = tokenizer.backend_tokenizer.to_str()
        # The text encoder: `encode_special_tokens` keeps only *special* added tokens as text, so
        # every added token is marked special in its copy: added again as special, it keeps its id
        # (editing the serialized JSON instead costs 0.5 s of a worker's start for Qwen's vocabulary).
        encoder = Tokenizer.from_str(serialized)
        encoder.add_special_tokens([
            AddedToken(token.content, single_word=token.single_word, lstrip=token.lstrip, rstrip=token.rstrip,
                       normalized=token.normalized, special=True)
            for token in encoder.get_added_tokens_decoder().values()])
        encoder.no_padding()
        encoder.no_truncation()
        encoder.encode_special_tokens = True
        self._encoder = encoder
        # Decoding reads the tokens as the tokenizer marks them (skip_special_tokens skips only special ones).
        self._decoder = Tokenizer.from_str(serialized)
        self._added = {token.content: token_id for token_id, token in tokenizer.added_tokens_decoder.items()}
        names = sorted(self._added, key=len, reverse=True)  # longest first: no token cut at a shorter one
        self._added_pattern = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None
        self.pad_token_id = tokenizer.pad_token_id

    def special_id(self, token: str) -> int:
        """The id of one of the tokenizer's added tokens (`<|im_end|>`)."""
        return self._added[token]

    @property
    def tool_call_tokens(self) -> ToolCallTokens | None:
        """The ids that open and close a generated tool call (None: the tokenizer has no such tokens)."""
        if OPEN not in self._added or CLOSE not in self._added:
            return None
        return ToolCallTokens(self._added[OPEN], self._added[CLOSE])

    def render(self, messages: Sequence[dict], tools: Sequence[dict] = ()) -> str:
        """The chat (and its tools) as text, the generation prompt after it (for reading; the model
        gets chat_ids)."""
        return self._template.apply_chat_template(list(messages), tools=list(tools) or None, tokenize=False,
                                                  add_generation_prompt=True)

    def prompt_ids(self, query: str, documents: Sequence, conversation: Conversation | None = None) -> list[int]:
        """The LLM prompt's token ids for a query, its reranked documents and its conversation."""
        return self.chat_ids(build_messages(query, documents, conversation), conversation.tools if conversation else ())

    def chat_ids(self, messages: Sequence[dict], tools: Sequence[dict] = ()) -> list[int]:
        """The chat's ids: every message's content, every tool's JSON and every earlier call's name and
        arguments are text (the service's system prompt holds no added-token string, so it encodes as
        the template renders it)."""
        slots = _Slots()
        slotted = [slots.message(m) for m in messages]
        frame = self.render(slotted, [slots.json(tool) for tool in tools])
        for slot, dumped in slots.dumped.items():
            frame = frame.replace(dumped, slot)
        split = _SLOT_PATTERN.split(frame)
        written = split[1::2]
        if sorted(written) != sorted(slots.texts):
            raise ValueError("the chat template does not write each client text exactly once")
        pieces: list[str | int] = [""]  # text runs between the template's special tokens, and their ids
        for n, template_text in enumerate(split[::2]):
            parts = self._added_pattern.split(template_text) if self._added_pattern else [template_text]
            for i, part in enumerate(parts):
                if i % 2:
                    pieces += [self._added[part], ""]
                else:
                    pieces[-1] = f"{pieces[-1]}{part}"
            if n < len(written):
                pieces[-1] = f"{pieces[-1]}{slots.texts[written[n]]}"
        runs = [piece for piece in pieces if isinstance(piece, str) and piece]
        encoded = iter(self._encoder.encode_batch(runs, add_special_tokens=False))
        ids: list[int] = []
        for piece in pieces:
            if isinstance(piece, int):
                ids.append(piece)
            elif piece:
                ids.extend(next(encoded).ids)
        return ids

    def text_ids(self, text: str) -> list[int]:
        """`text`'s ids as plain text: a control token's spelling stays text."""
        return list(self._encoder.encode(text, add_special_tokens=False).ids)

    @property
    def vocab_size(self) -> int:
        """Every id the decoder knows, the added tokens included."""
        return int(self._decoder.get_vocab_size(with_added_tokens=True))

    def count(self, text: str) -> int:
        """How many tokens `text` takes in a prompt (its added-token strings as text)."""
        return len(self.text_ids(text))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True, **_: Any) -> str:
        return self._decoder.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def left_padded(self, rows: Sequence[Sequence[int]]) -> dict:
        """Prompts' ids as one batch: input_ids and attention_mask, left-padded with the pad token."""
        import torch
        width = max(len(row) for row in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
            attention_mask[i, width - len(row):] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}
