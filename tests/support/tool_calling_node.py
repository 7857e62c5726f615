"""A real worker whose LLM calls a tool as Qwen2.5 would: a sequence whose prompt offers tools and holds
no call yet generates the token ids of `<tool_call>{CALL}</tool_call><|im_end|>` (the tokenizer's own
encoding, so `<tool_call>` is its added token's id), in place of the stand-in's noise; every other
sequence (no tools, or a tool's result already in the prompt) generates as the model does.
`python -m tests.support.tool_calling_node` with a worker's environment. The stand-in never writes a
call itself: this is how the HTTP tests get one through the real engine, output processor and routes.

A prompt offers tools and holds no call when the `<tool_call>` token's id appears in it exactly twice:
Qwen2.5's template writes it twice in the tools' instructions, once more for each earlier call.
"""
from __future__ import annotations

import json
import sys

from services import node
from tests.support.scripted_tokens import before_each_token, generator_tokenizer

CALL = {"name": "get_order_status", "arguments": {"order_id": "ABC123"}}
TEMPLATE_CALL_TOKENS = 2  # `<tool_call>`s in the tools' instructions of Qwen2.5's template


def script() -> tuple[int, list[int]]:
    """The `<tool_call>` token's id and the ids the model writes for CALL, its end-of-turn last."""
    tokenizer = generator_tokenizer()
    ids = tokenizer.encode(f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>", add_special_tokens=False)
    return ids[0], [*ids, tokenizer.convert_tokens_to_ids("<|im_end|>")]


def call_tools() -> None:
    """Every Scheduler of this process appends the script's tokens to a sequence that should call."""
    open_id, written = script()

    def scripted(seq, token: int) -> int:
        if seq.prompt_ids.count(open_id) == TEMPLATE_CALL_TOKENS and len(seq.generated) < len(written):
            return written[len(seq.generated)]
        return token

    before_each_token(scripted)


def main() -> int:
    call_tools()
    return node.main()


if __name__ == "__main__":
    sys.exit(main())
