"""Synthetic English the stand-in tokenizers are trained on, and the filler words that pad each
vocabulary to the real model's size.

The tokenizers are trained on text generated from the tables of ``training_text.json``: customer,
agent and help-centre templates over support-domain words, so common support words become single
tokens (as in the real vocabularies) and English lands near the real ~4 chars/token; general
English words, so the vocabularies are not purely domain-specific; the chat-format and RAG-prompt
lines the generator sees in every request; and a little non-English, so the multilingual
tokenizers are not English-only. Deterministic: a fixed seed, never the weight seed.
"""
from __future__ import annotations

import functools
import itertools
import json
import random
from importlib import resources
from typing import Callable, Iterator

_TABLES: dict[str, list[str]] = json.loads(
    (resources.files(__package__) / "training_text.json").read_text(encoding="utf-8")
)


def _fill(template: str, rng: random.Random) -> str:
    return template.format(
        product=rng.choice(_TABLES["products"]),
        issue=rng.choice(_TABLES["issues"]),
        topic=rng.choice(_TABLES["topics"]),
        carrier=rng.choice(_TABLES["carriers"]),
        time=rng.choice(_TABLES["times"]),
        day=rng.choice(_TABLES["days"]),
        name=rng.choice(_TABLES["names"]),
        feeling=rng.choice(_TABLES["feelings"]),
        price=f"{rng.randint(5, 500)}.{rng.randint(0, 99):02d}",
        order=rng.randint(100000, 999999),
        code=f"SAVE{rng.randint(5, 50)}",
        days=rng.randint(2, 30),
        days2=rng.randint(5, 14),
        years=rng.randint(1, 3),
        percent=rng.choice((5, 10, 15, 20, 25)),
        points=rng.choice((100, 500, 1000)),
    )


def _general_sentence(rng: random.Random) -> str:
    words = [rng.choice(_TABLES["general_words"]) for _ in range(rng.randint(5, 14))]
    if rng.random() < 0.5:
        words.insert(rng.randrange(len(words)), rng.choice(_TABLES["adjectives"]))
    sentence = " ".join(words)
    sentence = sentence[0].upper() + sentence[1:]
    return sentence + rng.choice((".", ".", ".", "?", "!", ","))


@functools.lru_cache(maxsize=1)
def training_text() -> tuple[str, ...]:
    """Deterministic training text (fixed seed: tokenizers never depend on the weight seed)."""
    rng = random.Random(20240601)
    lines: list[str] = []
    for _ in range(6000):
        lines.append(_fill(rng.choice(_TABLES["customer_templates"]), rng))
        lines.append(_fill(rng.choice(_TABLES["agent_templates"]), rng))
        if rng.random() < 0.5:
            lines.append(_fill(rng.choice(_TABLES["kb_templates"]), rng))
        lines.append(_general_sentence(rng))
        if rng.random() < 0.05:
            lines.append(rng.choice(_TABLES["multilingual"]))
        if rng.random() < 0.2:
            lines.append(
                rng.choice(_TABLES["prompt_lines"]).format(
                    question=_fill(rng.choice(_TABLES["customer_templates"]), rng),
                    answer=_fill(rng.choice(_TABLES["agent_templates"]), rng),
                    kb=_fill(rng.choice(_TABLES["kb_templates"]), rng),
                )
            )
    return tuple(lines)


@functools.lru_cache(maxsize=1)
def _stems() -> tuple[str, ...]:
    words: set[str] = set()
    for name in ("general_words", "products", "issues", "topics", "adjectives", "feelings"):
        for text in _TABLES[name]:
            for w in text.lower().replace("-", " ").split():
                if w.isascii() and w.isalpha() and len(w) > 1:
                    words.add(w)
    return tuple(sorted(words))


def _filler_words() -> Iterator[str]:
    """Endless deterministic stream of plausible word-like strings (duplicates possible)."""
    stems, suffixes, prefixes = _stems(), _TABLES["suffixes"], _TABLES["prefixes"]
    yield from (stem + suffix for suffix in suffixes for stem in stems)
    yield from (prefix + stem for prefix in prefixes for stem in stems)
    yield from (prefix + stem + suffix for prefix in prefixes for suffix in suffixes for stem in stems)
    for n in itertools.count():  # practically unreachable; keeps the generator total
        yield from (f"{stem}{n}" for stem in stems)


def pseudo_words() -> Iterator[str]:
    """Short pronounceable pseudo-words ("kotame"), ~6 chars like real SentencePiece pieces.

    Used for the 250k-entry Unigram vocab, whose load time grows with total piece
    length (long affixed fillers made the reranker tokenizer take seconds to load).
    """
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    for n in (2, 3):
        for combo in itertools.product(syllables, repeat=n):
            yield "".join(combo)


def fillers(
    count: int, render: Callable[[int, str], str], taken: set[str], words: Callable[[], Iterator[str]] = _filler_words
) -> list[str]:
    """``count`` unique vocab entries not in ``taken``; ``render(i, word)`` applies the
    tokenizer's surface form (space marker, casing)."""
    out: list[str] = []
    seen = set(taken)
    for i, word in enumerate(words()):
        if len(out) >= count:
            break
        tok = render(i, word)
        if tok not in seen:
            seen.add(tok)
            out.append(tok)
    return out
