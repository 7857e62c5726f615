"""/v1/embeddings', /v1/models', /tokenize's, /detokenize's, /v1/rerank's and /v1/moderations' request bodies
and response objects as pydantic models: with services/roles/gateway/openai_schemas.py, the source of
/openapi.json's schemas. A field that is None counts as not sent."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from pipeline import spec
from services.roles.gateway.openai_schemas import NOT_ACTED_ON, Closed, TextPart

# ---------------------------------------------------------------- /v1/embeddings and /v1/models

class EmbeddingRequest(Closed):
    """any other field is refused (400 naming it). Counted against GATEWAY_MAX_IN_FLIGHT."""
    model: str
    input: str | list[str]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(None, description="the embedder's own dimension only (EMBEDDER_MODEL's)")
    user: Any = Field(None, description=NOT_ACTED_ON)


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


# ---------------------------------------------------------------- /tokenize and /detokenize

class TokenizePromptRequest(Closed):
    """vLLM's TokenizeCompletionRequest. A prompt is bounded as a query (MAX_QUERY_CHARS, MAX_QUERY_TOKENS)."""
    model: str | None = Field(None, description="optional; must be the LLM's")
    prompt: str = Field(min_length=1)
    add_special_tokens: bool | None = None
    return_token_strs: Literal[False] | None = None


class TokenizeMessage(Closed):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart]


class TokenizeChatRequest(Closed):
    """vLLM's TokenizeChatRequest (role and content only): each message's content within MAX_QUERY_CHARS, all
    together within MAX_QUERY_TOKENS + MAX_HISTORY_TOKENS. Client text never becomes control tokens."""
    model: str | None = Field(None, description="optional; must be the LLM's")
    messages: list[TokenizeMessage] = Field(min_length=1)
    add_special_tokens: bool | None = None
    add_generation_prompt: Literal[True] | None = None
    continue_final_message: Literal[False] | None = None
    return_token_strs: Literal[False] | None = None


TokenizeRequest = TokenizePromptRequest | TokenizeChatRequest


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: None


class DetokenizeRequest(Closed):
    """At most MAX_QUERY_TOKENS + MAX_HISTORY_TOKENS + OPENAI_MAX_TOKENS_CAP ids, each in the vocabulary."""
    model: str | None = Field(None, description="optional; must be the LLM's")
    tokens: list[int] = Field(json_schema_extra={"items": {"type": "integer", "minimum": 0}})


class DetokenizeResponse(BaseModel):
    prompt: str


# ---------------------------------------------------------------- /v1/rerank and /v1/moderations

class RerankDocument(Closed):
    text: str


class RerankRequest(Closed):
    """Cohere's, Jina's and vLLM's rerank request."""
    model: Literal[spec.RERANKER_MODEL] | None = None  # type: ignore[valid-type]
    query: str = Field(description="within MAX_QUERY_CHARS and MAX_QUERY_TOKENS")
    documents: list[str | RerankDocument] = Field(min_length=1, description=(
        "at most STAGE_MAX_QUEUE; the query and each document together at most 512 reranker tokens"))
    top_n: int | None = Field(None, ge=1)
    return_documents: bool | None = Field(None, description="absent: true")
    user: Any = Field(None, description=NOT_ACTED_ON)


class RerankResult(BaseModel):
    index: int
    relevance_score: float = Field(ge=0, le=1)
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult] = Field(description="best first, top_n of them")


class ModerationRequest(Closed):
    """OpenAI's moderation request."""
    model: Literal[spec.TOXICITY_MODEL] | None = None  # type: ignore[valid-type]
    input: str | list[str | TextPart] = Field(description=(
        "an array: at most STAGE_MAX_QUEUE; each at most 512 toxicity-model tokens"),
        json_schema_extra={"minItems": 1})
    user: Any = Field(None, description=NOT_ACTED_ON)


class ModerationResult(BaseModel):
    flagged: bool
    categories: dict[str, bool]
    category_scores: dict[str, float]


class ModerationResponse(BaseModel):
    id: str
    model: str
    results: list[ModerationResult]
