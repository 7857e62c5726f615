"""Counting a stage's tokens on request threads, apart from the stage's own thread."""
from __future__ import annotations

import copy
import threading
from typing import Sequence


class TokenCounter:
    """Token counts of texts (or text pairs) as a model reads them, truncated, from any thread.

    It keeps its own copy of the stage's tokenizer, used one call at a time: a fast (Rust)
    tokenizer called from two threads at once, with its truncation or padding changing between
    calls, fails with "Already borrowed" (huggingface/transformers#47085), and the stage's
    thread encodes with the original meanwhile.
    """

    def __init__(self, tokenizer, max_length: int):
        self._tokenizer = copy.deepcopy(tokenizer)
        self._max_length = max_length
        self._lock = threading.Lock()

    def lengths(self, texts: Sequence) -> list[int]:
        if not texts:
            return []
        with self._lock:
            encoded = self._tokenizer(list(texts), truncation=True, max_length=self._max_length)
        return [len(ids) for ids in encoded["input_ids"]]
