"""A realistic customer-support corpus: help-centre articles assembled from per-topic sentence
templates plus concrete details (products, numbers of days, fees, carriers). Deterministic for a
seed, every document distinct, and ``support_documents(n)`` a prefix of ``support_documents(m)``
for n < m.

The text lives in ``articles/``: ``details.json`` (the products, and the details drawn once per
article so that its sentences agree) and one file per category (its topics and closing lines); a
topic's ``products`` is ``"electronics"`` or ``"all"`` (electronics and household).
"""
from __future__ import annotations

import functools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from builders.corpus.course import CATEGORIES
from pipeline.docstore import Document

_MAX_ATTEMPTS_PER_DOC = 1000
_SECOND_SENTENCE_P = 0.4
_MIN_CHARS = 360


@dataclass(frozen=True)
class Topic:
    key: str
    category: str
    products: list[str]
    titles: list[str]
    openers: list[str]
    # One sentence is chosen from each slot; slots give the article its structure.
    slots: list[list[str]]
    closers: list[str]  # the category's optional last sentences, that vary article length


def _read(name: str) -> Any:
    return json.loads((resources.files(__package__) / "articles" / f"{name}.json").read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=1)
def _details() -> dict[str, list]:
    return _read("details")["details"]


@functools.lru_cache(maxsize=1)
def _topics() -> dict[str, list[Topic]]:
    products = _read("details")["products"]
    products["all"] = products["electronics"] + products["household"]
    topics = {}
    for category in CATEGORIES:
        text = _read(category)
        topics[category] = [
            Topic(key=t["key"], category=category, products=products[t["products"]], titles=t["titles"],
                  openers=t["openers"], slots=t["slots"], closers=text["closers"])
            for t in text["topics"]
        ]
    return topics


def support_documents(n: int, seed: int = 0) -> Iterator[Document]:
    """``n`` distinct support articles with doc_ids 0..n-1, deterministic for ``seed``.

    Categories cycle like the course corpus (doc_id % 4) and each category
    visits its topics round-robin in a seeded order, so coverage is even;
    a draw that repeats an earlier article's content is re-drawn.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    cycles = {c: list(topics) for c, topics in _topics().items()}
    for topics in cycles.values():
        rng.shuffle(topics)
    seen: set[str] = set()
    for doc_id in range(n):
        topics = cycles[CATEGORIES[doc_id % len(CATEGORIES)]]
        topic = topics[(doc_id // len(CATEGORIES)) % len(topics)]
        title, content = _draw_distinct(topic, rng, seen)
        yield Document(doc_id=doc_id, title=title, content=content, category=topic.category)


def _draw_distinct(topic: Topic, rng: random.Random, seen: set[str]) -> tuple[str, str]:
    for _ in range(_MAX_ATTEMPTS_PER_DOC):
        title, content = _compose(topic, rng)
        if content not in seen:
            seen.add(content)
            return title, content
    raise RuntimeError(f"support corpus exhausted for topic {topic.key!r} after {len(seen)} documents")


def _compose(topic: Topic, rng: random.Random) -> tuple[str, str]:
    values = {key: rng.choice(options) for key, options in _details().items()}
    product = rng.choice(topic.products)
    values["product"] = product
    values["a_product"] = ("an " if product[0] in "aeiou" else "a ") + product
    sentences = [rng.choice(topic.openers)]
    for slot in topic.slots:
        sentences += _pick_sentences(slot, rng)
    content = " ".join(sentences).format_map(values)
    # A closing line on half of the articles, and always on the shortest ones.
    if rng.random() < 0.5 or len(content) < _MIN_CHARS:
        content += " " + rng.choice(topic.closers).format_map(values)
    title = rng.choice(topic.titles).format_map(values)
    return _capitalize(title), content


def _pick_sentences(slot: list[str], rng: random.Random) -> list[str]:
    # Sometimes two sentences from a slot (kept in template order) for varied length.
    count = 2 if rng.random() < _SECOND_SENTENCE_P else 1
    return [slot[i] for i in sorted(rng.sample(range(len(slot)), count))]


def _capitalize(text: str) -> str:
    # Titles may start with a product name ("{product} won't turn on").
    return text[:1].upper() + text[1:]
