"""The roofline of one request: what each model stage must compute and read, and the least time this CPU needs.

Every count is derived from a model's config (hidden size, layers, heads, KV heads, intermediate size, vocabulary,
labels) and the request's token lengths:

* MACs (multiply-adds; 2 FLOPs each) of the Linears, which the int8 variants quantize, and of
  attention's own matmuls (QK^T and PV), which stay float in every variant. Encoders attend over
  all keys (2 x tokens^2 x heads x head_dim per layer); a decoder's prefill is causal (query i
  sees i + 1 keys).
* Elements read: every Linear weight once per forward (and once per decode step: half a GB of
  weights does not stay in cache from one step to the next), the embedding rows of the tokens,
  and in decode the KV cache of each sequence.

A floor is max(compute, memory): compute = Linear FLOPs / the peak of the kind the Linears run in + attention FLOPs
/ the peak of the float kind; memory = bytes read / the measured read bandwidth. Decode steps are floored one by one
and summed. Not counted, so the floor stays a floor: activations, layer norms, softmax, biases, int8 scales
(together < 1 % of the bytes at batch 1), int8's per-row quantization, padding, search and fetch."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from profiling.lib.machine_peaks import Machine

# Rows of the table, in request order; prefill and decode are the generate stage's two halves.
ROWS = ("embed", "rerank", "prefill", "decode", "sentiment", "toxicity")
STAGE_OF_ROW = {"prefill": "generate", "decode": "generate"}
# A BERT-family token reads a row of the word, position and token-type tables.
ENCODER_EMBEDDING_TABLES = 3


@dataclass(frozen=True)
class Work:
    """What one pass over a model's weights computes and reads (elements, not bytes)."""
    linear_macs: int = 0
    attention_macs: int = 0
    weights: int = 0  # Linear weight elements, each read once per pass
    embedding_reads: int = 0  # embedding-table elements gathered for the tokens
    kv_reads: int = 0  # KV-cache elements read (decode)

    def __add__(self, other: "Work") -> "Work":
        return Work(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(Work)))


def together(works: Sequence[Work]) -> Work:
    """The works as one pass of one model: computed and gathered for each, weights read once."""
    total = sum(works, Work())
    return dataclasses.replace(total, weights=max((w.weights for w in works), default=0))


@dataclass(frozen=True)
class EncoderShape:
    """A BERT-family encoder: bge-base (labels 0: its pooler only), the reranker, the classifiers.
    `projection`: the width of a sentence-transformers Dense layer after the pooling (the tiny
    stand-in embedder's, to the contract's dimension), 0 for none (bge-base)."""
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    labels: int
    projection: int = 0

    @classmethod
    def from_config(cls, config: Any, labels: int | None = None, projection: int = 0) -> "EncoderShape":
        return cls(config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                   config.intermediate_size, config.vocab_size, config.num_labels if labels is None else labels,
                   projection)

    @property
    def layer_weights(self) -> int:
        """Q, K, V and the attention output (hidden^2 each), the MLP's up and down."""
        return 4 * self.hidden ** 2 + 2 * self.hidden * self.intermediate

    @property
    def head_weights(self) -> int:
        """On the first token only: the pooler or the classifier's dense layer, then the labels (or the projection)."""
        return self.hidden ** 2 + self.hidden * (self.labels + self.projection)

    def forward(self, tokens: int) -> Work:
        """One sequence of `tokens` tokens (special tokens included), unpadded."""
        return Work(linear_macs=tokens * self.layers * self.layer_weights + self.head_weights,
                    attention_macs=self.layers * 2 * tokens ** 2 * self.hidden,
                    weights=self.layers * self.layer_weights + self.head_weights,
                    embedding_reads=ENCODER_EMBEDDING_TABLES * tokens * self.hidden)


@dataclass(frozen=True)
class DecoderShape:
    """A Qwen2-style decoder: grouped-query attention, a gated MLP, logits over the vocabulary."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, config: Any) -> "DecoderShape":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                   config.num_key_value_heads, head_dim, config.intermediate_size, config.vocab_size)

    @property
    def layer_weights(self) -> int:
        """Q and O (hidden x heads x head_dim each), K and V (hidden x kv_heads x head_dim each),
        the MLP's gate, up and down."""
        return (2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
                + 3 * self.hidden * self.intermediate)

    @property
    def weights(self) -> int:
        """Every layer's Linears and the output head (vocab x hidden, tied to the embeddings or not)."""
        return self.layers * self.layer_weights + self.vocab * self.hidden

    @property
    def kv_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim

    def prefill(self, tokens: int, rows: int = 1) -> Work:
        """`rows` prompts of `tokens` tokens; logits of the last token only (as generate asks)."""
        return Work(linear_macs=rows * (tokens * self.layers * self.layer_weights + self.vocab * self.hidden),
                    attention_macs=rows * self.layers * self.heads * self.head_dim * tokens * (tokens + 1),
                    weights=self.weights, embedding_reads=rows * tokens * self.hidden)

    def step(self, context: int, rows: int = 1) -> Work:
        """One decode forward: one new token in each of `rows` sequences, attending to `context`
        keys (its own included) and reading that many keys and values from the cache."""
        return Work(linear_macs=rows * (self.layers * self.layer_weights + self.vocab * self.hidden),
                    attention_macs=rows * self.layers * self.heads * self.head_dim * 2 * context,
                    weights=self.weights, embedding_reads=rows * self.hidden,
                    kv_reads=rows * self.kv_per_token * context)

    def decode(self, prompt_tokens: int, new_tokens: int, rows: int = 1) -> list[Work]:
        """The decode forwards after the prefill: the prefill yields the first new token, so
        `new_tokens` tokens take new_tokens - 1 forwards, the k-th attending to prompt + k keys."""
        return [self.step(prompt_tokens + k, rows) for k in range(1, new_tokens)]


@dataclass(frozen=True)
class Models:
    embed: EncoderShape
    rerank: EncoderShape
    generate: DecoderShape
    sentiment: EncoderShape
    toxicity: EncoderShape


@dataclass(frozen=True)
class RequestTokens:
    """Token lengths of one request, as each model's tokenizer counts them."""
    query: int
    rerank: tuple[int, ...]  # each (query, document) pair
    prompt: int
    new_tokens: int
    sentiment: int
    toxicity: int


def row_works(models: Models, tokens: RequestTokens, requests: int = 1) -> dict[str, list[Work]]:
    """Each row's passes over its weights for `requests` requests served together."""
    def encoder(shape: EncoderShape, lengths: Sequence[int]) -> list[Work]:
        return [together([shape.forward(n) for n in lengths] * requests)]
    return {"embed": encoder(models.embed, [tokens.query]),
            "rerank": encoder(models.rerank, tokens.rerank),
            "prefill": [models.generate.prefill(tokens.prompt, requests)],
            "decode": models.generate.decode(tokens.prompt, tokens.new_tokens, requests),
            "sentiment": encoder(models.sentiment, [tokens.sentiment]),
            "toxicity": encoder(models.toxicity, [tokens.toxicity])}


@dataclass(frozen=True)
class PrecisionCost:
    """Where a precision variant (pipeline/precision.py) computes and how wide what it reads is."""
    linear_peak: str  # the PEAK_KINDS the Linears run at
    attention_peak: str
    weight_bytes: float  # per Linear weight (int4: half a byte and its group's share of a scale and offset)
    float_bytes: int  # per embedding or KV-cache element


PRECISION_COSTS = {
    "float32": PrecisionCost("float32", "float32", 4, 4),
    "bfloat16": PrecisionCost("bfloat16", "bfloat16", 2, 2),
    "int8-dynamic": PrecisionCost("int8", "float32", 1, 4),  # int8 x int8 Linears, the rest float32
    "int8-weight": PrecisionCost("bfloat16", "bfloat16", 1, 2),  # int8 weights widened to bfloat16
    # 4-bit codes and a bfloat16 scale and offset per 128 weights (pipeline/kernels/int4.py), widened to float32
    "int4-weight": PrecisionCost("bfloat16", "bfloat16", 0.5 + 4 / 128, 2),
    # the same codes, scales and offsets (pipeline/kernels/vnni_int4.py), int8 x int4 products
    "int4-dynamic": PrecisionCost("int8", "float32", 0.5 + 4 / 128, 4),
}


def bytes_read(work: Work, precision: str) -> float:
    cost = PRECISION_COSTS[precision]
    return work.weights * cost.weight_bytes + (work.embedding_reads + work.kv_reads) * cost.float_bytes


@dataclass(frozen=True)
class Floor:
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    floor_s: float  # max(compute, memory) of each pass, summed over passes

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"

    def __add__(self, other: "Floor") -> "Floor":
        return Floor(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(Floor)))


def floor_of(work: Work, precision: str, machine: Machine) -> Floor:
    cost = PRECISION_COSTS[precision]
    linear, attention = 2 * work.linear_macs, 2 * work.attention_macs
    compute = linear / machine.peaks[cost.linear_peak] + attention / machine.peaks[cost.attention_peak]
    nbytes = bytes_read(work, precision)
    memory = nbytes / machine.read_bandwidth
    return Floor(linear + attention, nbytes, compute, memory, max(compute, memory))


def floor_of_passes(works: Sequence[Work], precision: str, machine: Machine) -> Floor:
    return sum((floor_of(w, precision, machine) for w in works), Floor(0, 0, 0, 0, 0))


@dataclass(frozen=True)
class PlanFloor:
    """The floors of one precision plan (a variant for every stage, or `fast`'s mix)."""
    name: str
    precisions: dict[str, str]  # row -> variant
    idle: dict[str, Floor]  # row -> floor of one request alone
    concurrency: int
    concurrent: dict[str, Floor]  # row -> floor of `concurrency` requests served together

    @property
    def idle_s(self) -> float:
        return sum(f.floor_s for f in self.idle.values())

    @property
    def concurrent_s(self) -> float:
        return sum(f.floor_s for f in self.concurrent.values())

    @property
    def concurrent_rpm(self) -> float:
        return 60.0 * self.concurrency / self.concurrent_s


def plan_floor(name: str, stage_precisions: Mapping[str, str], models: Models, tokens: RequestTokens,
               machine: Machine, concurrency: int) -> PlanFloor:
    """`stage_precisions`: stage (embed, rerank, generate, sentiment, toxicity) -> variant."""
    precisions = {row: stage_precisions[STAGE_OF_ROW.get(row, row)] for row in ROWS}
    def floors(requests: int) -> dict[str, Floor]:
        works = row_works(models, tokens, requests)
        return {row: floor_of_passes(works[row], precisions[row], machine) for row in ROWS}
    return PlanFloor(name, precisions, floors(1), concurrency, floors(concurrency))


# What a measured-times file may give: per-row seconds, `generate` (prefill + decode), the whole
# idle request, and requests per minute at the plan's concurrency.
MEASURED_KEYS = ROWS + ("generate", "request", "concurrency_rpm")


@dataclass(frozen=True)
class Comparison:
    what: str
    measured: float
    floor: float
    unit: str
    times_floor: float  # how many floors the measured figure is (1.0 = at the roofline)

    @property
    def fraction(self) -> float:
        """The share of the roofline reached: 1 / times_floor."""
        return 1.0 / self.times_floor


def compare(plan: PlanFloor, measured: Mapping[str, float]) -> list[Comparison]:
    """Each measured figure beside its floor; a key outside MEASURED_KEYS is a ValueError."""
    unknown = sorted(set(measured) - set(MEASURED_KEYS))
    if unknown:
        raise ValueError(f"unknown measured key(s) {', '.join(unknown)}: expected {', '.join(MEASURED_KEYS)}")
    floors = {row: plan.idle[row].floor_s for row in ROWS}
    floors["generate"] = floors["prefill"] + floors["decode"]
    floors["request"] = plan.idle_s
    out = []
    for key in MEASURED_KEYS:
        if key not in measured:
            continue
        value = float(measured[key])
        if key == "concurrency_rpm":
            out.append(Comparison(f"{key} (c={plan.concurrency})", value, plan.concurrent_rpm, "req/min",
                                  plan.concurrent_rpm / value))
        else:
            out.append(Comparison(key, value, floors[key], "s", value / floors[key]))
    return out
