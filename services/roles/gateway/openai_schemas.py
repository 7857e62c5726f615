"""The public routes' request bodies and response objects as pydantic models: the one source of
/openapi.json's schemas (services/roles/gateway/openapi.py builds the document from them).

The routes parse bodies by their own rules (services/roles/gateway/openai_api.py and the routes'
modules); these models say what those rules accept. A field that is None counts as not sent.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.continuous.output import FinishReason

NOT_ACTED_ON = "accepted, logged by name and not acted on: it cannot change the answer"
SEED = "a sampled request without one gets a drawn seed, returned in the response's seed field"
MAX_TOKENS = "clamped to OPENAI_MAX_TOKENS_CAP; absent: 128"
TEMPERATURE = "absent: OPENAI_DEFAULT_TEMPERATURE"
N = "choices, each its own answer; a sampled one's choice i decodes with seed + i"
EXTRA_RAG = "extension: sentiment, is_toxic, request_id"
EXTRA_SEED = "extension: the seed of a sampled answer"
Stop = str | list[str]


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- chat pieces

class ToolCallFunction(BaseModel):
    name: str
    arguments: str = Field(description="JSON text of an object")


class ToolCall(BaseModel):
    """a call the model made (its generated <tool_call> tokens)"""
    id: str = Field(description="call_ and 24 hex digits")
    type: Literal["function"]
    function: ToolCallFunction


class FunctionSpec(BaseModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON Schema of the arguments")


class FunctionTool(BaseModel):
    """an OpenAI function tool, rendered by Qwen2.5's chat template (its JSON as text)"""
    type: Literal["function"]
    function: FunctionSpec


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(None, description="null: an assistant message with tool_calls")
    tool_calls: list[ToolCall] | None = Field(
        None, description="an assistant message's calls; each arguments JSON text of an object")
    tool_call_id: str | None = Field(
        None, description="a tool message's: accepted and not rendered (Qwen2.5's template matches results to calls by order)")


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(BaseModel):
    """other keys are accepted, logged and not acted on"""
    include_usage: bool | None = None


class TurnCall(Closed):
    name: str = Field(min_length=1)
    arguments: str = Field(description="JSON text of an object")


class Turn(Closed):
    """an earlier turn of a conversation (tool: a tool's result)"""
    role: Literal["user", "assistant", "tool"]
    content: str
    tool_calls: list[TurnCall] | None = Field(None, description="an assistant turn's tool calls, in order")


# ---------------------------------------------------------------- /query

class Query(Closed):
    """request_id, query, stream and history only: any other field is refused (400 naming it);
    /query's answer is the contract's greedy one"""
    request_id: str
    query: str
    stream: bool | None = None
    history: list[Turn] | None = Field(None, description=(
        "earlier turns, oldest first; the newest that fit MAX_HISTORY_TOKENS are rendered before the question, the "
        "oldest dropped first (the reply's history_turns_dropped says how many); a short follow-up is retrieved with "
        "the user turns before it (docs/api.md)"))


class PassageSource(BaseModel):
    """an ingested version's passage"""
    id: int = Field(description="the passage's row (its FAISS id)")
    document: str = Field(description="the source document's id: its path under the source root, or its record's id")
    title: str
    heading: str = Field(description="the passage's heading path")
    url: str | None


class QueryReply(BaseModel):
    request_id: str
    generated_response: str
    sentiment: str
    is_toxic: str
    data_version: str | None = Field(None, description=(
        "the data version (documents and index build) that answered: its search and its fetch both read it "
        "(docs/scaling.md, Data versions)"))
    sources: list[int | PassageSource] | None = Field(None, description=(
        "the passages the answer was given, reranked, best first, from data_version: doc_ids for a course or "
        "support build, objects naming each passage's document for an ingested one"))
    history_turns_dropped: int | None = Field(None, ge=0, description=(
        "with a history: how many of its oldest turns the prompt left out (MAX_HISTORY_TOKENS)"))


# ---------------------------------------------------------------- /v1/chat/completions and /v1/completions

class Sampling(BaseModel):
    """What both generating routes read the same way. The fields accepted only at a no-op value are added to
    each route's schema from openai_api.NO_OP (services/roles/gateway/openapi.py), every other field refused."""
    model: str
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, description=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2, description=TEMPERATURE)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = Field(None, description=SEED)
    stop: Stop | None = Field(None, json_schema_extra={"maxItems": 4})
    n: int | None = Field(None, ge=1, le=8, description=N)
    request_id: str | None = Field(None, description="extension: the idempotency key")
    user: Any = Field(None, description=NOT_ACTED_ON)
    safety_identifier: Any = Field(None, description=NOT_ACTED_ON)
    metadata: Any = Field(None, description=NOT_ACTED_ON)
    service_tier: Any = Field(None, description=NOT_ACTED_ON)
    prompt_cache_key: Any = Field(None, description=NOT_ACTED_ON)


class ChatCompletionRequest(Sampling):
    """Every other field is refused (400 naming it), but those accepted and not acted on (user,
    safety_identifier, metadata, service_tier, parallel_tool_calls, prompt_cache_key) and fields at the value
    that asks for what the service does anyway (presence/frequency_penalty 0, min_p 0, response_format text,
    store false ...)."""
    messages: list[ChatMessage] = Field(min_length=1, description=(
        "the latest user message is the question; user, assistant and tool messages before it are the conversation "
        "(the oldest dropped beyond MAX_HISTORY_TOKENS: usage.history_turns_dropped); assistant calls and tool "
        "results after it (the last message a tool's) follow the question; system and developer messages are "
        "added after the service's system prompt"))
    tools: list[FunctionTool] | None = Field(None, max_length=128, description=(
        "rendered by the model's chat template as tool_choice says; names unique"))
    tool_choice: Literal["auto", "none"] | NamedToolChoice | None = Field(None, description=(
        "auto (absent): every tool shown, calls read; none: no tool shown, no call read; a named function: only that "
        "tool shown (not forced: greedy decoding may answer in text). required: 400"))
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = Field(None, description="each answer token's log probability (from the engine's own logits)")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="alternatives per token; only with logprobs true")
    parallel_tool_calls: bool | None = Field(None, description="false: at most one tool call (the answer ends where it closes)")


class CompletionRequest(Sampling):
    """Every other field is refused (400 naming it), but fields at the value that asks for what the service does
    anyway (presence/frequency_penalty 0, min_p 0, best_of 1, echo false ...)."""
    prompt: str | list[str] = Field(description="the question (an array: of one string)",
                                    json_schema_extra={"minItems": 1, "maxItems": 1})
    logprobs: int | None = Field(None, ge=0, le=20, description=(
        "each answer token's log probability with this many alternatives"))


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    history_turns_dropped: int | None = Field(None, description=(
        "extension, with earlier turns: how many of the oldest the prompt left out"))


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None = Field(description="null with tool_calls and no other text")
    refusal: None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    """streamed, a tool call is deltas: its index, id, type and name first, then its arguments in pieces"""
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: dict[str, Any] | None = None


class ChatCompletion(BaseModel):
    """a chat.completion; with stream: true, chat.completion.chunk events closed by data: [DONE]"""
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    seed: int | None = Field(None, description=EXTRA_SEED)
    rag: dict[str, Any] | None = Field(None, description=EXTRA_RAG)


class TextChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: dict[str, Any] | None = Field(None, description="tokens, token_logprobs, top_logprobs, text_offset")


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage
    seed: int | None = Field(None, description=EXTRA_SEED)
    rag: dict[str, Any] | None = Field(None, description=EXTRA_RAG)



# ---------------------------------------------------------------- streamed chunks (text/event-stream, closed by data: [DONE])

class ToolCallFunctionDelta(BaseModel):
    name: str | None = Field(None, description="on the call's first delta")
    arguments: str | None = Field(None, description="the next characters of its arguments (JSON text)")


class ToolCallDelta(BaseModel):
    """a call as it is generated: its index, id, type and name first, then its arguments in pieces"""
    index: int
    id: str | None = Field(None, description="on the call's first delta: call_ and 24 hex digits")
    type: Literal["function"] | None = None
    function: ToolCallFunctionDelta


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = Field(None, description="each call's name, then its arguments in pieces")


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    logprobs: dict[str, Any] | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(BaseModel):
    """the role first, one per text piece, one per tool call, the last choice's (finish_reason, rag, seed), then
    with stream_options.include_usage one with no choices and the usage (null before)"""
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    seed: int | None = Field(None, description=EXTRA_SEED)
    rag: dict[str, Any] | None = Field(None, description=EXTRA_RAG)


class TextChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: Literal["stop", "length"] | None


class TextCompletionChunk(BaseModel):
    """one per text piece, the last choice's (finish_reason, rag, seed), then with stream_options.include_usage
    one with no choices and the usage (null before)"""
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChunkChoice]
    usage: Usage | None = None
    seed: int | None = Field(None, description=EXTRA_SEED)
    rag: dict[str, Any] | None = Field(None, description=EXTRA_RAG)
