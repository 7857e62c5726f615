"""The contract of ../shared/SPEC.md in code: constants, prompt, label rules, in one place so that
the reference and the batched stages cannot drift apart."""
from __future__ import annotations

from enum import StrEnum
from typing import Mapping, Protocol, Sequence


class Stage(StrEnum):
    """The stages of one request, in order, plus node 2's side of search; a StrEnum, so a stage is its
    own name in settings variables (`EMBED_MAX_BATCH`), metric labels and JSON keys."""
    EMBED = "embed"
    SEARCH = "search"
    FETCH = "fetch"
    RERANK = "rerank"
    GENERATE = "generate"
    SENTIMENT = "sentiment"
    TOXICITY = "toxicity"
    INDEX = "index"  # node 2 merges the workers' search batches into one faiss search


WORKER_STAGES = (Stage.EMBED, Stage.SEARCH, Stage.FETCH, Stage.RERANK, Stage.GENERATE, Stage.SENTIMENT,
                 Stage.TOXICITY)
MODEL_STAGES = (Stage.EMBED, Stage.RERANK, Stage.GENERATE, Stage.SENTIMENT, Stage.TOXICITY)

EMBED_DIM = 768
TOP_K = 10
MAX_NEW_TOKENS = 128
TRUNCATE_LENGTH = 512  # tokens for the reranker, characters for the classifiers
CONTEXT_DOCS = 3
CONTEXT_CHARS = 200
TOXICITY_THRESHOLD = 0.5

EMBEDDER_MODEL = "BAAI/bge-base-en-v1.5"
RERANKER_MODEL = "BAAI/bge-reranker-base"
GENERATOR_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
SENTIMENT_MODEL = "nlptown/bert-base-multilingual-uncased-sentiment"
TOXICITY_MODEL = "unitary/toxic-bert"

# The document store: DOCUMENTS_DIR holds DOCUMENTS_DB, one table, the same schema
# for the course and the support layouts.
DOCUMENTS_DB = "documents.db"
DOCUMENTS_TABLE = "documents"
DOCUMENTS_COLUMNS = ("doc_id", "title", "content", "category")
DOCUMENTS_SCHEMA = (f"CREATE TABLE {DOCUMENTS_TABLE} (doc_id INTEGER PRIMARY KEY, title TEXT NOT NULL, "
                    "content TEXT NOT NULL, category TEXT NOT NULL)")

SYSTEM_PROMPT = "When given Context and Question, reply as 'Answer: <final answer>' only."

SENTIMENTS = ("very negative", "negative", "neutral", "positive", "very positive")
STAR_LABELS: Mapping[str, str] = {
    "1 star": "very negative",
    "2 stars": "negative",
    "3 stars": "neutral",
    "4 stars": "positive",
    "5 stars": "very positive",
}

REFERENCE_QUERIES = (
    "How do I return a defective product?",
    "What is your refund policy?",
    "My order hasn't arrived yet, tracking number is ABC123",
    "How do I update my billing information?",
    "Is there a warranty on electronic items?",
    "Can I change my shipping address after placing an order?",
    "What payment methods do you accept?",
    "How long does shipping typically take?",
)


class HasTitleAndContent(Protocol):
    title: str
    content: str


def build_context(ranked_docs: Sequence[HasTitleAndContent]) -> str:
    """The top three reranked documents, one line each, as the reference built it."""
    return "\n".join(f"- {doc.title}: {doc.content[:CONTEXT_CHARS]}" for doc in ranked_docs[:CONTEXT_DOCS])


def build_messages(query: str, ranked_docs: Sequence[HasTitleAndContent]) -> list[dict]:
    context = build_context(ranked_docs)
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Context:\n{context}\n\nQuestion: {query}\n\nAnswer:"}]


def sentiment_from_label(label: str) -> str:
    """Map the classifier's top star label; anything unexpected is neutral."""
    return STAR_LABELS.get(label, "neutral")


def is_toxic_flag(top_probability: float) -> str:
    """`"true"` when the top toxic label's probability is over the threshold."""
    return "true" if top_probability > TOXICITY_THRESHOLD else "false"


def classifier_text(response: str) -> str:
    """The classifiers see the response cut to 512 characters."""
    return response[:TRUNCATE_LENGTH]


def answer_json(request_id: str, generated_response: str, sentiment: str, is_toxic: str) -> dict:
    """The reply body of POST /query."""
    return {"request_id": request_id, "generated_response": generated_response,
            "sentiment": sentiment, "is_toxic": is_toxic}


TOXIC_FLAGS = ("true", "false")


def validate_reply(body: object, request_id: str) -> list[str]:
    """What is wrong with a POST /query reply body for `request_id`; [] when it honours the contract
    (extra fields are allowed, SPEC). A list, not a raise: a load tool counts a bad reply as one error kind."""
    if not isinstance(body, dict):
        return [f"reply is not a JSON object: {type(body).__name__}"]
    problems = []
    if body.get("request_id") != request_id:
        problems.append(f"request_id {body.get('request_id')!r} is not the {request_id!r} sent")
    if not isinstance(body.get("generated_response"), str):
        problems.append(f"generated_response {body.get('generated_response')!r} is not a string")
    if body.get("sentiment") not in SENTIMENTS:
        problems.append(f"sentiment {body.get('sentiment')!r} is not one of {', '.join(SENTIMENTS)}")
    if body.get("is_toxic") not in TOXIC_FLAGS:
        problems.append(f"is_toxic {body.get('is_toxic')!r} is not 'true' or 'false'")
    return problems
