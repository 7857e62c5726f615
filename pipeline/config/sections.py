"""The settings in sections: one frozen dataclass per component (the cluster, the models, each stage, the
limits, the gateway, HTTP, observability), each field bound to one environment variable (fields.var).
A component is given its own section and nothing else; `Sections` holds them all."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pipeline.config.fields as f
import pipeline.config.parsers as p
from pipeline.config.parsers import Address
from pipeline.spec import EMBEDDER_MODEL, Stage

# Waitress closes a connection quiet for REQUEST_TIMEOUT_S plus this, so none is cut while a
# request could still be waited on.
CHANNEL_TIMEOUT_MARGIN_S = 60.0


def default_node_ip(node: int) -> str:
    """Where a node listens unless its NODE_<n>_IP says otherwise: 127.0.0.1, port 8000 + n."""
    return f"127.0.0.1:{8000 + node}"


@dataclass(frozen=True)
class ClusterSettings:
    """Which node this is, where every node listens, which role each node has (named by settings, not
    numbers: node 0 is the gateway and a worker, INDEX_NODES serve the index, the rest are workers), and
    how nodes call each other."""
    total_nodes: int = f.var("TOTAL_NODES", p.int_range(3, p.MAX_NODES), "3", "number of nodes (3 or more): node 0 is the gateway and a worker, INDEX_NODES serve the index, every other node is a worker")
    node_number: int | None = f.var("NODE_NUMBER", p.optional(p.int_range(0, p.MAX_NODES - 1)), "", "this node's number, below TOTAL_NODES (0: gateway+worker; its role follows from INDEX_NODES); empty for tools")
    node_0_ip: Address = f.var("NODE_0_IP", p.address, "127.0.0.1:8000", "host:port of node 0 (gateway and worker): where the others reach it")
    node_1_ip: Address = f.var("NODE_1_IP", p.address, "127.0.0.1:8001", "host:port of node 1 (a worker, with the default INDEX_NODES)")
    node_2_ip: Address = f.var("NODE_2_IP", p.address, "127.0.0.1:8002", "host:port of node 2 (the index server, with the default INDEX_NODES)")
    more_node_ips: dict[int, Address] = f.numbered("NODE_{n}_IP", 3, p.address, default_node_ip, "host:port of node n, for 3 <= n < TOTAL_NODES (default 127.0.0.1:800n: 8000 + n)")
    bind_host: str = f.var("BIND_HOST", p.optional_host, "", "address this node listens on (empty: the host of its own NODE_<n>_IP); 0.0.0.0 in a container whose NODE_<n>_IP is the name the others reach it by")
    index_nodes: tuple[int, ...] = f.var("INDEX_NODES", p.node_list, "2", "nodes that serve the FAISS index (never node 0); every other node is a worker")
    index_shards: int = f.var("INDEX_SHARDS", p.int_range(1, p.MAX_NODES), "1", "shards the index is split in (python -m builders.data build --shards N); the index node at position p of INDEX_NODES serves shard p % INDEX_SHARDS, so nodes beyond the shard count are replicas")
    worker_nodes: tuple[int, ...] = f.var("WORKER_NODES", p.optional(p.node_list, ()), "", "workers the gateway round-robins requests between (empty: every worker node)")
    connect_timeout_s: float = f.var("CONNECT_TIMEOUT_S", p.positive_float, "3", "connect timeout of node-to-node calls")
    worker_discovery: Address | None = f.var("WORKER_DISCOVERY", p.optional(p.address), "", "host:port whose DNS name lists the workers the gateway routes to besides its own (every A record a worker at that port: a Kubernetes headless Service, a compose service scaled to N), re-resolved every DISCOVERY_INTERVAL_S; a new one gets requests once its /health is ready, a vanished one none; empty: the static NODE_<n>_IP list (WORKER_NODES)")
    index_discovery: tuple[Address, ...] = f.var("INDEX_DISCOVERY", p.optional(p.address_list, ()), "", "comma-separated host:port, one per index shard in shard order, whose DNS name lists that shard's replicas (every A record), re-resolved every DISCOVERY_INTERVAL_S; empty: the static INDEX_NODES addresses")
    discovery_interval_s: float = f.var("DISCOVERY_INTERVAL_S", p.positive_float, "5", "how often WORKER_DISCOVERY and INDEX_DISCOVERY names are resolved again")
    discovery_hosts_file: Path | None = f.var("DISCOVERY_HOSTS_FILE", p.optional(p.path), "", "a hosts-style file (`IP name...` lines, read at every resolution) that discovery names are looked up in instead of DNS, for machines without a DNS server that lists them; empty: DNS")
    cluster_token: str = f.var("CLUSTER_TOKEN", p.token, "", "shared secret every internal endpoint (/search, /internal/answer, /cache/clear) requires in X-Cluster-Token; required (the node refuses to start without it) wherever a node listens beyond loopback; empty on 127.0.0.1 only", secret=True)

    # ---------------------------------------------------------------- the topology

    def node_address(self, node: int) -> Address:
        if node < 3:
            return (self.node_0_ip, self.node_1_ip, self.node_2_ip)[node]
        return self.more_node_ips.get(node) or p.address(default_node_ip(node))

    @property
    def nodes(self) -> range:
        return range(self.total_nodes)

    @property
    def workers(self) -> tuple[int, ...]:
        """Every node that runs the model stages (node 0 first)."""
        return tuple(n for n in self.nodes if n not in self.index_nodes)

    @property
    def rotation(self) -> tuple[int, ...]:
        """The workers the gateway sends requests to."""
        return self.worker_nodes or self.workers

    def role_of(self, node: int) -> str:
        """"gateway" (node 0, a worker too), "index" or "worker"."""
        return "gateway" if node == 0 else "index" if node in self.index_nodes else "worker"

    def served_shard(self, node: int) -> int:
        """The index shard an index node serves."""
        return self.index_nodes.index(node) % self.index_shards

    def replicas(self, shard: int) -> tuple[int, ...]:
        """The index nodes serving one shard, in INDEX_NODES order."""
        return tuple(n for n in self.index_nodes if self.served_shard(n) == shard)

    def bind_address(self, node: int) -> Address:
        """Where `node` listens: BIND_HOST (or its own NODE_<n>_IP's host) at its own port."""
        own = self.node_address(node)
        return Address(self.bind_host or own.host, own.port)


@dataclass(frozen=True)
class ModelSettings:
    """Where the model weights come from, and the device and precision they run in."""
    only_cpu: bool = f.var("ONLY_CPU", p.boolean, "false", "true forces the CPU even where a GPU exists")
    hf_hub_offline: bool = f.var("HF_HUB_OFFLINE", p.boolean, "false", "true: never contact the Hugging Face hub (huggingface_hub reads it too); MODEL_SOURCE=auto then uses cached real models or stand-ins")
    model_source: str = f.var("MODEL_SOURCE", p.choice("auto", "hub", "standin", "null"), "auto", "hub: real models (`./run.sh models` checks the cache; a node without them and without the hub exits at once naming the fetch commands); standin: offline random-weight stand-ins; auto: real if cached or downloadable; null: a MEASUREMENT mode, never for serving: every model stage a stand-in of fixed, near-zero cost (the stand-ins' tokenizers, fixed outputs of the right shapes), so only the service's own overhead is timed (docs/performance.md)")
    standin_profile: str = f.var("STANDIN_PROFILE", p.choice("tiny", "faithful"), "tiny", "stand-in size: tiny for tests and demo, faithful (real shapes) for benchmarks")
    standin_home: Path | None = f.var("STANDIN_HOME", p.optional(p.path), "", "where stand-ins are built (default .cache/standins/<profile>)")
    precision: str = f.var("PRECISION", p.precision, "auto", "what every model stage computes in (per stage: <STAGE>_PRECISION). auto: bfloat16 on a CPU with avx512_bf16 or AMX and on a GPU with bf16, else float32 (float16 on a GPU without bf16); float32 (CPU only); bfloat16; float16 (GPU only); int8-dynamic, int8-weight, int4-dynamic (group-wise 4-bit weights x int8 activations) and int4-weight (4-bit weights, bfloat16 activations) (CPU only); fast: a variant per stage from the table pipeline/precision_policy.py FAST (int8, bfloat16 or float32 per stage, answers may differ slightly), measured for CPUs with avx512_bf16 (AMD EPYC) and with AMX (Intel Xeon); its row for other CPUs is not measured. `./run.sh settings` prints what each stage resolves to")
    torch_threads: int = f.var("TORCH_THREADS", p.int_range(0, 1024), "0", "torch intra-op threads; 0 = the core count")


class BatchWindow(Protocol):
    """What every stage section but generate's (continuous batching, no window) has: its batch window."""
    @property
    def max_batch(self) -> int | None: ...
    @property
    def max_wait_ms(self) -> float: ...


class ModelStage(Protocol):
    """A model stage's section: its precision override."""
    @property
    def precision(self) -> str: ...


@dataclass(frozen=True)
class EmbedSettings:
    max_batch: int = f.max_batch(Stage.EMBED, 16, "measured: 84 ms per query alone, 29 ms at 16")
    max_wait_ms: float = f.max_wait(Stage.EMBED, 5)
    precision: str = f.precision(Stage.EMBED, "embedder")
    cache_size: int = f.var("EMBED_CACHE_SIZE", p.int_range(0, 10_000_000), "1024", "query embeddings each worker keeps (LRU; 0 = off): the same question skips the embedder")
    model: str = f.var("EMBEDDER_MODEL", p.model_name, EMBEDDER_MODEL, "the sentence-transformers model that embeds queries and passages: a Hugging Face repo id or a local folder; its dimension, pooling and normalisation are the model's own; a data version built by another embedder is refused (rebuild it with this one)")


@dataclass(frozen=True)
class SearchSettings:
    """The worker's side of search: one HTTP call to node 2 per batch."""
    max_batch: int = f.max_batch(Stage.SEARCH, 16, "one HTTP call to node 2 per batch; faiss: 34 ms per query alone, 13 ms at 16")
    max_wait_ms: float = f.max_wait(Stage.SEARCH, 5)
    timeout_s: float = f.var("SEARCH_TIMEOUT_S", p.positive_float, "30", "read timeout of a search call to node 2")


@dataclass(frozen=True)
class FetchSettings:
    max_batch: int = f.max_batch(Stage.FETCH, 32, "one SQL query per batch; about 4 ms per request at any size")
    max_wait_ms: float = f.max_wait(Stage.FETCH, 2)
    documents_dir: Path = f.var("DOCUMENTS_DIR", p.path, "data/demo/documents", "folder holding documents.db (workers)")

    @property
    def documents_db(self) -> Path:
        return self.documents_dir / "documents.db"


@dataclass(frozen=True)
class RerankSettings:
    max_batch: int | None = f.var("RERANK_MAX_BATCH", p.optional(p.int_range(1, 4096)), "", "largest batch the rerank stage runs (empty: the device's, RERANK_MAX_BATCH_BY_DEVICE: 1 on a CPU, where a rerank's cost follows its tokens and a batch only delays its first request; 8 on a GPU, where a batch's requests share launches: 632 and 697 requests a minute at 32 clients on an H200 against 595 at 1, one run each; docs/performance.md)")
    max_wait_ms: float = f.max_wait(Stage.RERANK, 0)
    precision: str = f.precision(Stage.RERANK, "reranker")


@dataclass(frozen=True)
class GenerateSettings:
    """Continuous batching: sequences join and leave the running batch at every decode step (no batch window)."""
    max_batch: int = f.max_batch(Stage.GENERATE, 16, "sequences decoding together; one decode step measured 476 ms at 8, 554 ms at 16 (2.99x the one-at-a-time reference's tokens/s)")
    precision: str = f.precision(Stage.GENERATE, "LLM")
    kv_cache_tokens: int = f.var("GENERATE_KV_CACHE_TOKENS", p.int_range(256, 10_000_000), "16384", "KV-cache tokens the running sequences' slots may take together, each slot as long as the longest sequence's prompt + 128 new tokens in whole 256-token chunks; bounds its memory (Qwen2-0.5B: 24 KiB a token in float32, so about 400 MB)")
    prefill_chunk: int = f.var("GENERATE_PREFILL_CHUNK", p.int_range(2, 100_000), "512", "prompt tokens prefilled per iteration (one more where a prompt's last token would be a chunk of its own), so decoding sequences wait at most that long; at least 2: a chunk of one token attends as a decode step does")


@dataclass(frozen=True)
class SentimentSettings:
    max_batch: int = f.max_batch(Stage.SENTIMENT, 16, "measured: 308 ms per text alone, 200 ms at 16")
    max_wait_ms: float = f.max_wait(Stage.SENTIMENT, 5)
    precision: str = f.precision(Stage.SENTIMENT, "sentiment classifier")


@dataclass(frozen=True)
class ToxicitySettings:
    max_batch: int = f.max_batch(Stage.TOXICITY, 16, "measured: 325 ms per text alone, 189 ms at 16")
    max_wait_ms: float = f.max_wait(Stage.TOXICITY, 5)
    precision: str = f.precision(Stage.TOXICITY, "toxicity classifier")


@dataclass(frozen=True)
class IndexSettings:
    """Node 2: the FAISS index it serves and how it merges concurrent searches."""
    max_batch: int = f.max_batch(Stage.INDEX, 32, "node 2 merges concurrent searches")
    max_wait_ms: float = f.max_wait(Stage.INDEX, 2)
    faiss_index_path: Path = f.var("FAISS_INDEX_PATH", p.path, "data/demo/faiss_index.bin", "the FAISS index node 2 serves")
    nprobe: int | None = f.var("NPROBE", p.optional(p.int_range(1, 65536)), "", "IVF lists probed per FAISS search; empty: what the data version's manifest records (its build measured or tuned it)")
    ef_search: int | None = f.var("INDEX_EF_SEARCH", p.optional(p.int_range(1, 65536)), "", "HNSW search breadth (efSearch) for an HNSW index; empty: what the manifest records")
    min_recall: float = f.var("INDEX_MIN_RECALL", p.float_range(0.0, 1.0), "0.95", "recall@10 floor a data build must meet against an exact search (builders.recall; --accept-low-recall writes it anyway)")
    faiss_mmap: bool = f.var("FAISS_MMAP", p.boolean, "true", "memory-map the index file instead of reading it into RAM")
    faiss_threads: int = f.var("FAISS_THREADS", p.int_range(0, 1024), "0", "faiss's OpenMP threads: an index node's searches, a worker's centroid routing; 0 = the core count")


@dataclass(frozen=True)
class LimitsSettings:
    """What one request may cost and how long it may take (docs/failure-behaviour.md)."""
    request_timeout_s: float = f.var("REQUEST_TIMEOUT_S", p.positive_float, "280", "a request unanswered after this gets 504 (clients wait 300 s)")
    stage_max_queue: int = f.var("STAGE_MAX_QUEUE", p.int_range(1, 1_000_000), "256", "items a stage may hold waiting before it answers 503")
    max_request_id_chars: int = f.var("MAX_REQUEST_ID_CHARS", p.int_range(1, 1_000_000), "256", "longest request_id accepted (longer: 400)")
    max_query_chars: int = f.var("MAX_QUERY_CHARS", p.int_range(1, 1_000_000), "4096", "longest query accepted (longer: 400)")
    max_query_tokens: int = f.var("MAX_QUERY_TOKENS", p.int_range(16, 1_000_000), "1024", "longest query accepted in the LLM tokenizer's tokens (longer: 400); emoji and some scripts take several tokens a character, and the embedder and reranker read only the first 512 anyway")
    max_history_tokens: int = f.var("MAX_HISTORY_TOKENS", p.int_range(0, 1_000_000), "1024", "a conversation's share of the prompt in the LLM tokenizer's tokens: the client's instructions (over it: 400), then the newest earlier turns that fit, each with its template's 5 tokens; older turns are dropped and the reply says how many (docs/api.md)")
    max_body_bytes: int = f.var("MAX_BODY_BYTES", p.int_range(256, 64 * 1024 * 1024), "65536", "largest /query or /internal/answer body accepted (larger: 413)")
    shutdown_grace_s: float = f.var("SHUTDOWN_GRACE_S", p.non_negative_float, "60", "after SIGTERM, how long a node lets requests in flight finish; those still running then get 503 'stopping' (retry) and the node exits. Well under REQUEST_TIMEOUT_S, so the gateway can still recompute a stopped node 1's requests on node 0 (a warning at startup otherwise)")
    failed_linger_s: float = f.var("FAILED_LINGER_S", p.non_negative_float, "5", "a node whose models or data fail to load answers /health and /ready 503 'failed' with the reason this long, then exits (2 when the operator must change something, else 1): at least your probes' period, so one of them sees why")


@dataclass(frozen=True)
class GatewaySettings:
    """Node 0's admission, request_id rules, reply caches and worker health probes."""
    max_in_flight: int = f.var("GATEWAY_MAX_IN_FLIGHT", p.int_range(1, 100_000), "96", "distinct requests node 0 computes at once; more get an immediate 503 with Retry-After")
    max_joiners_per_id: int = f.var("GATEWAY_MAX_JOINERS_PER_ID", p.int_range(0, 100_000), "8", "callers that may wait on one request_id already in flight (each holds an HTTP thread); more get an immediate 503")
    max_joiners: int = f.var("GATEWAY_MAX_JOINERS", p.int_range(0, 100_000), "16", "callers that may wait on request_ids in flight, all ids together; under the 32 spare HTTP threads, so /health and 503s always get one")
    health_interval_s: float = f.var("HEALTH_INTERVAL_S", p.positive_float, "2", "how often the gateway re-checks a worker out of rotation")
    response_cache_size: int = f.var("RESPONSE_CACHE_SIZE", p.int_range(0, 10_000_000), "0", "replies node 0 keeps by normalised query (0 = off: valid only while models and documents are fixed)")
    response_cache_ttl_s: float = f.var("RESPONSE_CACHE_TTL_S", p.non_negative_float, "300", "how long a cached reply is served (s; 0 = until evicted or POST /cache/clear)")
    idempotency_cache_size: int = f.var("IDEMPOTENCY_CACHE_SIZE", p.int_range(0, 10_000_000), "1024", "completed replies node 0 keeps to answer a repeated request_id without recomputing (0 = none)")
    idempotency_ttl_s: float = f.var("IDEMPOTENCY_TTL_S", p.non_negative_float, "300", "how long a completed reply stays in that cache (s)")


@dataclass(frozen=True)
class ApiSettings:
    """The public API's clients: node 0's /v1 (OpenAI-compatible) defaults and caps, API keys and CORS."""
    default_temperature: float = f.var("OPENAI_DEFAULT_TEMPERATURE", p.float_range(0.0, 2.0), "0", "the temperature a /v1 chat request that names none gets; 0 = greedy, so a client's repeated question gets the same answer as /query's, which the contract fixes as greedy (vLLM instead follows the model's generation config)")
    max_tokens_cap: int = f.var("OPENAI_MAX_TOKENS_CAP", p.int_range(1, 8192), "512", "most new tokens a /v1 answer may have; a larger max_tokens is clamped to it (finish_reason 'length'), no max_tokens gets the contract's 128. With the query and prompt allowance it must fit a quarter of GENERATE_KV_CACHE_TOKENS")
    api_keys_file: Path | None = f.var("API_KEYS_FILE", p.optional(p.path), "", "a file of API keys, one a line (a key, or sha256:<hex of its SHA-256>; # comments); set: /query and /v1/* need 'Authorization: Bearer <key>' (else 401); health, ready and metrics stay open; empty = no keys")
    cors_allowed_origins: tuple[str, ...] = f.var("CORS_ALLOWED_ORIGINS", p.origin_list, "", "browser origins (scheme://host[:port], comma-separated, or *) allowed to call /query and /v1/* across origins; empty = CORS off")


@dataclass(frozen=True)
class HttpSettings:
    """Each node's HTTP server: threads, connections, and how long a request may take to arrive."""
    waitress_threads: int = f.var("WAITRESS_THREADS", p.int_range(0, 1024), "0", "HTTP threads per node; 0 = GATEWAY_MAX_IN_FLIGHT + 32 spare on workers, 32 on the index server")
    read_timeout_s: float = f.var("HTTP_READ_TIMEOUT_S", p.non_negative_float, "0", "a request's headers and body must arrive within this many seconds of its first byte (a new connection's first request: of the connect), else the connection is closed; slow clients (slowloris) cannot hold connections; 0 = REQUEST_TIMEOUT_S / 30 within 2..30 s")
    connection_limit: int = f.var("HTTP_CONNECTION_LIMIT", p.int_range(0, 1_000_000), "0", "open HTTP connections a node accepts at once (beyond: new ones wait unaccepted); 0 = the larger of 1024 and 4 per HTTP thread")


# OpenTelemetry's own sampler names (OTEL_TRACES_SAMPLER), as its SDK reads them.
OTEL_SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
                 "parentbased_traceidratio")


@dataclass(frozen=True)
class ObservabilitySettings:
    """Logs and traces (services/server/tracing.py)."""
    log_level: str = f.var("LOG_LEVEL", p.choice("debug", "info", "warning", "error"), "info", "logging level")
    log_format: str = f.var("LOG_FORMAT", p.choice("text", "json"), "text", "node log lines: text for people, json for log collectors (one object per line: time, node, level, logger, message and the request's fields)")
    tracing: str = f.var("TRACING", p.choice("off", "otlp", "jsonl"), "off", "OpenTelemetry tracing: off; otlp = export spans over OTLP/HTTP to TRACING_ENDPOINT; jsonl = append one JSON span per line to TRACING_FILE (W3C trace context crosses nodes 0 -> 1 -> 2 either way)")
    tracing_endpoint: str = f.var("TRACING_ENDPOINT", p.text, "", "OTLP/HTTP traces endpoint (a collector, Jaeger, Tempo) when TRACING=otlp; empty = OpenTelemetry's own: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, else http://localhost:4318/v1/traces")
    # Read by the OpenTelemetry SDK itself when TRACING is on; here to be listed and checked at startup.
    otel_endpoint: str = f.var("OTEL_EXPORTER_OTLP_ENDPOINT", p.text, "", "TRACING=otlp: the collector's OTLP/HTTP base URL (the SDK appends /v1/traces); empty = http://localhost:4318")
    otel_service_name: str = f.var("OTEL_SERVICE_NAME", p.text, "", "TRACING on: the spans' service.name (OTEL_RESOURCE_ATTRIBUTES adds attributes); empty = rag-node-<N>")
    otel_sampler: str = f.var("OTEL_TRACES_SAMPLER", p.choice(*OTEL_SAMPLERS), "parentbased_always_on", "TRACING on: which requests are traced (the SDK's samplers); *traceidratio keeps the OTEL_TRACES_SAMPLER_ARG share of traces, parentbased_* follow a caller's traceparent decision")
    otel_sampler_arg: float | None = f.var("OTEL_TRACES_SAMPLER_ARG", p.optional(p.float_range(0.0, 1.0)), "", "the share of traces kept (0..1) by OTEL_TRACES_SAMPLER=traceidratio or parentbased_traceidratio; empty = 1.0")
    tracing_file: str = f.var("TRACING_FILE", p.text, "", "file spans are appended to when TRACING=jsonl (empty = logs/traces-node<N>.jsonl)")


def _section(section_type: type, title: str) -> Any:
    """A field holding one section; its title heads the section in env.example and the configmap."""
    return dataclasses.field(metadata={"section": section_type, "title": title})


@dataclass(frozen=True)
class Sections:
    """Every section, one field each: what the consistency checks (checks.py) read; Settings builds them."""
    cluster: ClusterSettings = _section(ClusterSettings, "the cluster (SPEC): which node this is, where every node listens, node-to-node calls")
    models: ModelSettings = _section(ModelSettings, "models: where the weights come from, device, precision, threads")
    embed: EmbedSettings = _section(EmbedSettings, "stage 1, embed")
    search: SearchSettings = _section(SearchSettings, "stage 2, search (the worker's side: one HTTP call to node 2 per batch)")
    fetch: FetchSettings = _section(FetchSettings, "stage 3, fetch (SQLite)")
    rerank: RerankSettings = _section(RerankSettings, "stage 4, rerank")
    generate: GenerateSettings = _section(GenerateSettings, "stage 5, generate (the LLM; continuous batching, no batch window)")
    sentiment: SentimentSettings = _section(SentimentSettings, "stage 6, sentiment")
    toxicity: ToxicitySettings = _section(ToxicitySettings, "stage 7, toxicity")
    index: IndexSettings = _section(IndexSettings, "node 2: the FAISS index")
    limits: LimitsSettings = _section(LimitsSettings, "limits: what one request may cost and how long it may take")
    gateway: GatewaySettings = _section(GatewaySettings, "node 0's gateway: admission, request_id rules, reply caches, worker health probes")
    http: HttpSettings = _section(HttpSettings, "HTTP servers")
    api: ApiSettings = _section(ApiSettings, "the public API: /v1 defaults and caps, API keys, CORS")
    observability: ObservabilitySettings = _section(ObservabilitySettings, "logs and traces")

    @property
    def channel_timeout_s(self) -> float:
        """Waitress's channel timeout: above the request timeout (CHANNEL_TIMEOUT_MARGIN_S)."""
        return self.limits.request_timeout_s + CHANNEL_TIMEOUT_MARGIN_S
