"""A real worker whose LLM writes slowly for questions that ask it to: a sequence whose prompt holds the
token ids of MARKER waits STEP_S after each token it generates; every other sequence generates as the
model does. `python -m tests.support.slow_generate_node` with a worker's environment. The tiny stand-in
writes its 128 tokens in well under a second, too soon for a reader to stop; this gives the browser
test an answer that is still streaming when its stop button is pressed."""
from __future__ import annotations

import sys
import time

from services import node
from tests.support.scripted_tokens import before_each_token, generator_tokenizer

MARKER = "zzslowlyzz"
STEP_S = 0.25  # 128 tokens take 32 s: the stop comes long before the end


def marker_ids() -> list[int]:
    return generator_tokenizer().encode(f" {MARKER}", add_special_tokens=False)


def holds(ids: list[int], part: list[int]) -> bool:
    return any(ids[i:i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def write_slowly() -> None:
    """Every Scheduler of this process waits after each token of a sequence whose prompt holds MARKER."""
    part = marker_ids()

    def slowly(seq, token: int) -> int:
        if holds(seq.prompt_ids, part):
            time.sleep(STEP_S)
        return token

    before_each_token(slowly)


def main() -> int:
    write_slowly()
    return node.main()


if __name__ == "__main__":
    sys.exit(main())
