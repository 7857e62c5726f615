"""What every stand-in tokenizer shares: the byte-level alphabet, the extra characters every vocabulary
knows, the files a tokenizer repo ships, and the one reproducible trainer (plain BPE)."""
from __future__ import annotations

import functools
import json
from typing import Any, Iterable


def byte_level(text: str) -> str:
    """``text`` in the GPT-2 / Qwen byte-level alphabet (printable stand-ins for all 256 bytes)."""
    if text.isascii() and text.lstrip(" ").isalpha():  # fast path for fillers: only the space maps
        return text.replace(" ", "Ġ")
    return "".join(piece for piece, _ in _byte_level_splitter().pre_tokenize_str(text))


@functools.lru_cache(maxsize=None)
def _byte_level_splitter() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


# Characters every tokenizer knows even if the corpus lacks them (real vocabs
# cover them; without this, e.g. "€" or "é" would become [UNK]).
EXTRA_ALPHABET = sorted(
    set(chr(c) for c in range(0x21, 0x7F))
    | set(chr(c) for c in range(0xA1, 0x180) if chr(c).isprintable())
    | set("€£¥–—‘’“”•…™©®°±×÷")
)


def added_token(content: str, special: bool = True, lstrip: bool = False,
                normalized: bool | None = None) -> dict[str, Any]:
    """A tokenizer_config.json entry; ``normalized`` defaults to ``not special`` (transformers' own default)."""
    return {
        "content": content,
        "lstrip": lstrip,
        "normalized": not special if normalized is None else normalized,
        "rstrip": False,
        "single_word": False,
        "special": special,
    }


def tokenizer_file_set(tok: Any, config: dict[str, Any], vocab_files: dict[str, str] | None = None,
                       special_map: bool = True) -> dict[str, str]:
    """The files a tokenizer repo ships: tokenizer.json, its config, the special-tokens map (the
    config's ``*_token`` entries) unless ``special_map`` is off, then the model's vocabulary files."""
    files = {"tokenizer.json": tok.to_str(pretty=False), "tokenizer_config.json": dumps(config)}
    if special_map:
        files["special_tokens_map.json"] = dumps({k: v for k, v in config.items() if k.endswith("_token")})
    return {**files, **(vocab_files or {})}


def train_bpe_model(tok: Any, corpus: Iterable[str], alphabet: list[str]) -> dict[str, Any]:
    """Train a plain BPE on ``tok`` (normalizer/pre-tokenizer already set); its model JSON.

    Plain BPE is the one `tokenizers` trainer that is reproducible across
    processes (its alphabet ids are sorted and merge ties break on ids). The
    WordPiece and Unigram trainers are not: their hash-map order changes the
    learned vocab from run to run, so those vocabularies are derived from this.
    """
    from tokenizers import trainers

    trainer = trainers.BpeTrainer(
        vocab_size=60000, min_frequency=2, show_progress=False, initial_alphabet=alphabet, special_tokens=[]
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return json.loads(tok.to_str())["model"]


def train_bpe(tok: Any, corpus: Iterable[str], alphabet: list[str]) -> list[str]:
    """The tokens of :func:`train_bpe_model`, in id order."""
    vocab = train_bpe_model(tok, corpus, alphabet)["vocab"]
    return [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
