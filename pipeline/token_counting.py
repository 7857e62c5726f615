"""Counting a stage's tokens on request threads while the stage's own thread encodes."""
from __future__ import annotations

import threading
from typing import Sequence


class TokenCounter:
    """Token counts of texts (or text pairs) as a model reads them, truncated, from any thread.

    Every call holds `lock`, which whoever else calls `tokenizer` must hold too (or the tokenizer
    is a copy only this counter uses): a fast (Rust) tokenizer called from two threads at once,
    its truncation or padding changing between calls, miscounts or fails with "Already borrowed"
    (huggingface/transformers#47085).
    """

    def __init__(self, tokenizer, max_length: int, lock: threading.Lock):
        self._tokenizer = tokenizer
        self._max_length = max_length
        self._lock = lock

    def lengths(self, texts: Sequence) -> list[int]:
        if not texts:
            return []
        with self._lock:
            encoded = self._tokenizer(list(texts), truncation=True, max_length=self._max_length)
        return [len(ids) for ids in encoded["input_ids"]]
