"""One typed, immutable settings object built from the environment, here only.

Every variable the project reads is a field below, with its parser, default and
one-line help; env.example is checked against this list by a test. Bad values
raise one ConfigError with one line per problem (each naming the variable, the
value and what is accepted), which entry points print instead of a traceback.
`python -m pipeline.config` prints the effective settings.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline import spec
from pipeline.spec import MODEL_STAGES, Stage

REPO_ROOT = Path(__file__).resolve().parent.parent
STAGES = tuple(Stage)  # every stage with a batching service: the worker's seven and node 2's index
DTYPES = ("auto", "float32", "bfloat16", "float16")
# How a model stage computes (pipeline/precision.py): exact = its *_DTYPE, fast = the table
# of each stage's fastest variant on this hardware, or one variant by name.
PRECISION_MODES = ("exact", "fast")
PRECISION_VARIANTS = ("float32", "bfloat16", "int8-dynamic", "int8-weight")
# Waitress closes a connection that has no request in progress after this long quiet
# (idle keep-alive connections between nodes, stalled uploads): Settings.channel_timeout_s
# is REQUEST_TIMEOUT_S plus this, so no connection is cut while a request could still be
# waited on, and pooled node-to-node connections survive a quiet spell.
CHANNEL_TIMEOUT_MARGIN_S = 60.0
# The longest /internal/answer `timeout_s` a worker accepts (a sanity bound on what another
# node sends). The gateway forwards up to REQUEST_TIMEOUT_S, so that must not exceed it.
MAX_INTERNAL_TIMEOUT_S = 3600.0
# MAX_QUERY_TOKENS must leave room in the continuous KV budget (GENERATE_MAX_TOKENS) for the
# prompt around the query (system prompt, three 200-character context lines: a generous
# allowance) and the 128 new tokens, so that the largest request reserves at most a quarter
# of the budget and never makes every other request wait behind its prefill.
PROMPT_ALLOWANCE_TOKENS = 512
KV_SHARE_OF_LARGEST_REQUEST = 4
# Derived HTTP read timeout (HTTP_READ_TIMEOUT_S=0): REQUEST_TIMEOUT_S / 30, within these bounds:
# long enough for a 32 MiB /search upload on a LAN, short enough that a slowloris socket
# holds a connection for seconds, not for the request timeout.
READ_TIMEOUT_SHARE, MIN_READ_TIMEOUT_S, MAX_READ_TIMEOUT_S = 30.0, 2.0, 30.0
# Derived connection limit (HTTP_CONNECTION_LIMIT=0): at least this many, or 4 per HTTP thread.
# An open connection costs waitress a few KB (a partial header at most services.server.http's header cap).
MIN_CONNECTION_LIMIT = 1024


# How a secret's value is shown anywhere it could be logged or served.
HIDDEN = "<hidden>"


# What an entry point prints before each problem (and exits 2).
CONFIG_ERROR_PREFIX = "config error: "


class ConfigError(ValueError):
    """Bad environment values: one line per problem, meant for the operator (`problems`).

    Every entry point prints `f"config error: {exc}"`, so str() puts that prefix before each
    problem after the first: the print shows every problem on a line of its own, prefixed.
    """

    def __init__(self, *problems: str):
        super().__init__(("\n" + CONFIG_ERROR_PREFIX).join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class BatchConfig:
    max_size: int
    max_wait_ms: float
    max_queue: int


# ---- parsers: each takes the raw string and returns the value or raises ValueError(accepted)

def _int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        what = "an integer" + (f" >= {lo}" if lo is not None and hi is None else "")
        if lo is not None and hi is not None:
            what = f"an integer from {lo} to {hi}"
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(what) from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ValueError(what)
        return value
    return parse


def _positive_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("a number > 0") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("a number > 0")
    return value


def _non_negative_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("a number >= 0") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError("a number >= 0")
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("true or false (also 1/0, yes/no, on/off)")


def _choice(*options: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        lowered = raw.strip().lower()
        if lowered not in options:
            raise ValueError("one of " + ", ".join(options))
        return lowered
    return parse


def _optional_dtype(raw: str) -> str:
    return "" if not raw.strip() else _choice(*DTYPES)(raw)


def _optional_precision(raw: str) -> str:
    return "" if not raw.strip() else _choice(*PRECISION_MODES, *PRECISION_VARIANTS)(raw)


def _precision(stage: str, model: str) -> Any:
    return var(f"{stage.upper()}_PRECISION", _optional_precision, "",
               f"precision of the {model} (empty: PRECISION): exact, fast, float32, bfloat16, int8-dynamic or int8-weight")


def _address(raw: str) -> Address:
    what = "host:port with a port from 1 to 65535 (for example 10.0.0.5:8000)"
    host, sep, port = raw.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(what)
    return Address(host.strip("[]"), int(port))


def _path(raw: str) -> Path:
    if not raw.strip():
        raise ValueError("a file system path")
    path = Path(raw.strip()).expanduser()
    return path if path.is_absolute() else (Path.cwd() / path)


def _optional_path(raw: str) -> Path | None:
    return _path(raw) if raw.strip() else None


def _node_list(raw: str) -> tuple[int, ...]:
    what = "a comma-separated list of distinct node numbers, for example 0,1"
    try:
        nodes = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise ValueError(what) from None
    if not nodes or len(set(nodes)) != len(nodes) or min(nodes) < 0:
        raise ValueError(what)
    return nodes


def _text(raw: str) -> str:
    return raw


def _token(raw: str) -> str:
    # It travels in an HTTP header: visible ASCII only, so no encoding can change it on the way.
    token = raw.strip()
    if any(not 0x21 <= ord(c) <= 0x7E for c in token):
        raise ValueError("printable ASCII without spaces (or empty to turn the check off)")
    return token


def var(env: str, parse: Callable[[str], Any], default: str, help: str, *, secret: bool = False) -> Any:
    """A settings field bound to one environment variable; a secret one is left out of repr()."""
    return field(repr=not secret, metadata={"env": env, "parse": parse, "default": default, "help": help})


def _max_batch(stage: str, size: int, why: str) -> Any:
    return var(f"{stage.upper()}_MAX_BATCH", _int_range(1, 4096), str(size),
               f"largest batch the {stage} stage runs ({why}; docs/performance.md)")


def _max_wait(stage: str, wait_ms: int) -> Any:
    return var(f"{stage.upper()}_MAX_WAIT_MS", _non_negative_float, str(wait_ms),
               f"how long the {stage} stage's oldest item may wait for a fuller batch (ms)")


@dataclass(frozen=True)
class Settings:
    # --- the cluster (SPEC)
    total_nodes: int = var("TOTAL_NODES", _int_range(3, 3), "3", "number of nodes; the design has exactly 3")
    node_number: int | None = var("NODE_NUMBER", _int_range(0, 2), "", "this node's role: 0 gateway+worker, 1 worker, 2 index server; empty for tools")
    node_0_ip: Address = var("NODE_0_IP", _address, "127.0.0.1:8000", "host:port of node 0 (gateway and worker)")
    node_1_ip: Address = var("NODE_1_IP", _address, "127.0.0.1:8001", "host:port of node 1 (worker)")
    node_2_ip: Address = var("NODE_2_IP", _address, "127.0.0.1:8002", "host:port of node 2 (FAISS index server)")
    worker_nodes: tuple[int, ...] = var("WORKER_NODES", _node_list, "0,1", "nodes the gateway round-robins requests between")
    # --- data (SPEC)
    faiss_index_path: Path = var("FAISS_INDEX_PATH", _path, "data/demo/faiss_index.bin", "the FAISS index node 2 serves")
    documents_dir: Path = var("DOCUMENTS_DIR", _path, "data/demo/documents", "folder holding documents.db (workers)")
    nprobe: int = var("NPROBE", _int_range(1, 65536), "64", "IVF lists probed per FAISS search")
    faiss_mmap: bool = var("FAISS_MMAP", _bool, "true", "memory-map the index file instead of reading it into RAM")
    # --- models
    only_cpu: bool = var("ONLY_CPU", _bool, "false", "true forces the CPU even where a GPU exists")
    hf_hub_offline: bool = var("HF_HUB_OFFLINE", _bool, "false", "true: never contact the Hugging Face hub (huggingface_hub reads it too); MODEL_SOURCE=auto then uses cached real models or stand-ins")
    model_source: str = var("MODEL_SOURCE", _choice("auto", "hub", "standin"), "auto", "hub: real models (`./run.sh models` checks the cache; a node without them and without the hub exits at once naming the fetch commands); standin: offline random-weight stand-ins; auto: real if cached or downloadable")
    standin_profile: str = var("STANDIN_PROFILE", _choice("tiny", "faithful"), "tiny", "stand-in size: tiny for tests and demo, faithful (real shapes) for benchmarks")
    standin_home: Path | None = var("STANDIN_HOME", _optional_path, "", "where stand-ins are built (default .cache/standins/<profile>)")
    dtype: str = var("DTYPE", _choice(*DTYPES), "auto", "model dtype: auto = bfloat16 on CPUs with avx512_bf16/AMX, else float32; never float16 on CPU")
    embed_dtype: str = var("EMBED_DTYPE", _optional_dtype, "", "dtype override for the embedder (empty: DTYPE)")
    rerank_dtype: str = var("RERANK_DTYPE", _optional_dtype, "", "dtype override for the reranker (empty: DTYPE)")
    generate_dtype: str = var("GENERATE_DTYPE", _optional_dtype, "", "dtype override for the LLM (empty: DTYPE)")
    sentiment_dtype: str = var("SENTIMENT_DTYPE", _optional_dtype, "", "dtype override for the sentiment classifier (empty: DTYPE)")
    toxicity_dtype: str = var("TOXICITY_DTYPE", _optional_dtype, "", "dtype override for the toxicity classifier (empty: DTYPE)")
    precision: str = var("PRECISION", _choice(*PRECISION_MODES), "exact", "exact: each model as loaded in its *_DTYPE (today's behaviour); fast: each stage's fastest measured variant on this hardware (pipeline/precision.py FAST; int8 or bfloat16, answers may differ slightly)")
    embed_precision: str = _precision(Stage.EMBED, "embedder")
    rerank_precision: str = _precision(Stage.RERANK, "reranker")
    generate_precision: str = _precision(Stage.GENERATE, "LLM")
    sentiment_precision: str = _precision(Stage.SENTIMENT, "sentiment classifier")
    toxicity_precision: str = _precision(Stage.TOXICITY, "toxicity classifier")
    # --- threads
    torch_threads: int = var("TORCH_THREADS", _int_range(0, 1024), "0", "torch intra-op threads; 0 = the core count")
    faiss_threads: int = var("FAISS_THREADS", _int_range(0, 1024), "0", "faiss OpenMP threads; 0 = the core count")
    waitress_threads: int = var("WAITRESS_THREADS", _int_range(0, 1024), "0", "HTTP threads per node; 0 = GATEWAY_MAX_IN_FLIGHT + 32 spare on workers, 32 on the index server")
    # --- batching, one pair per stage (defaults from docs/performance.md once measured)
    embed_max_batch: int = _max_batch(Stage.EMBED, 16, "measured: 84 ms per query alone, 29 ms at 16")
    embed_max_wait_ms: float = _max_wait(Stage.EMBED, 5)
    search_max_batch: int = _max_batch(Stage.SEARCH, 16, "one HTTP call to node 2 per batch; faiss: 34 ms per query alone, 13 ms at 16")
    search_max_wait_ms: float = _max_wait(Stage.SEARCH, 5)
    fetch_max_batch: int = _max_batch(Stage.FETCH, 32, "one SQL query per batch; about 4 ms per request at any size")
    fetch_max_wait_ms: float = _max_wait(Stage.FETCH, 2)
    rerank_max_batch: int = _max_batch(Stage.RERANK, 1, "measured: about 2.9 s per request at 1, 2 and 4; batching only delays the first")
    rerank_max_wait_ms: float = _max_wait(Stage.RERANK, 0)
    generate_max_batch: int = _max_batch(Stage.GENERATE, 16, "continuous mode: sequences decoding together; one decode step measured 476 ms at 8, 554 ms at 16 (2.99x the one-at-a-time reference's tokens/s)")
    generate_max_wait_ms: float = _max_wait(Stage.GENERATE, 20)
    generate_mode: str = var("GENERATE_MODE", _choice("continuous", "static"), "continuous", "continuous: sequences join and leave the running batch every decode step; static: whole batches through generate()")
    generate_max_tokens: int = var("GENERATE_MAX_TOKENS", _int_range(256, 10_000_000), "16384", "continuous mode: KV-cache tokens (prompt + 128 new) the running sequences may reserve; bounds its memory (Qwen2-0.5B: 24 KiB a token in float32, so about 400 MB)")
    generate_prefill_chunk: int = var("GENERATE_PREFILL_CHUNK", _int_range(1, 100_000), "512", "continuous mode: prompt tokens prefilled per iteration, so decoding sequences wait at most that long")
    sentiment_max_batch: int = _max_batch(Stage.SENTIMENT, 16, "measured: 308 ms per text alone, 200 ms at 16")
    sentiment_max_wait_ms: float = _max_wait(Stage.SENTIMENT, 5)
    toxicity_max_batch: int = _max_batch(Stage.TOXICITY, 16, "measured: 325 ms per text alone, 189 ms at 16")
    toxicity_max_wait_ms: float = _max_wait(Stage.TOXICITY, 5)
    index_max_batch: int = _max_batch(Stage.INDEX, 32, "node 2 merges concurrent searches")
    index_max_wait_ms: float = _max_wait(Stage.INDEX, 2)
    stage_max_queue: int = var("STAGE_MAX_QUEUE", _int_range(1, 1_000_000), "256", "items a stage may hold waiting before it answers 503")
    # --- time
    request_timeout_s: float = var("REQUEST_TIMEOUT_S", _positive_float, "280", "a request unanswered after this gets 504 (clients wait 300 s)")
    connect_timeout_s: float = var("CONNECT_TIMEOUT_S", _positive_float, "3", "connect timeout of node-to-node calls")
    search_timeout_s: float = var("SEARCH_TIMEOUT_S", _positive_float, "30", "read timeout of a search call to node 2")
    health_interval_s: float = var("HEALTH_INTERVAL_S", _positive_float, "2", "how often the gateway re-checks a worker out of rotation")
    startup_timeout_s: float = var("STARTUP_TIMEOUT_S", _positive_float, "300", "how long ./run.sh local waits for the nodes to become healthy")
    demo_interval_s: float = var("DEMO_INTERVAL_S", _non_negative_float, "0.5", "./run.sh demo: seconds between the client's queries")
    shutdown_grace_s: float = var("SHUTDOWN_GRACE_S", _non_negative_float, "60", "after SIGTERM, how long a node lets requests in flight finish; those still running then get 503 'stopping' (retry) and the node exits. Well under REQUEST_TIMEOUT_S, so the gateway can still recompute a stopped node 1's requests on node 0 (a warning at startup otherwise)")
    local_restart_limit: int = var("LOCAL_RESTART_LIMIT", _int_range(0, 1000), "5", "./run.sh local: restarts of one node that died allowed within LOCAL_RESTART_WINDOW_S; beyond, that node is given up on (loudly) and the others keep serving")
    local_restart_window_s: float = var("LOCAL_RESTART_WINDOW_S", _positive_float, "600", "./run.sh local: the window LOCAL_RESTART_LIMIT counts restarts in (s); a node loads its models in up to minutes")
    # --- load and input limits (what happens beyond them: README "Failure behaviour and its knobs")
    gateway_max_in_flight: int = var("GATEWAY_MAX_IN_FLIGHT", _int_range(1, 100_000), "96", "distinct requests node 0 computes at once; more get an immediate 503 with Retry-After")
    gateway_max_joiners_per_id: int = var("GATEWAY_MAX_JOINERS_PER_ID", _int_range(0, 100_000), "8", "callers that may wait on one request_id already in flight (each holds an HTTP thread); more get an immediate 503")
    gateway_max_joiners: int = var("GATEWAY_MAX_JOINERS", _int_range(0, 100_000), "16", "callers that may wait on request_ids in flight, all ids together; under the 32 spare HTTP threads, so /health and 503s always get one")
    max_request_id_chars: int = var("MAX_REQUEST_ID_CHARS", _int_range(1, 1_000_000), "256", "longest request_id accepted (longer: 400)")
    max_query_chars: int = var("MAX_QUERY_CHARS", _int_range(1, 1_000_000), "4096", "longest query accepted (longer: 400)")
    max_query_tokens: int = var("MAX_QUERY_TOKENS", _int_range(16, 1_000_000), "1024", "longest query accepted in the LLM tokenizer's tokens (longer: 400); emoji and some scripts take several tokens a character, and the embedder and reranker read only the first 512 anyway")
    max_body_bytes: int = var("MAX_BODY_BYTES", _int_range(256, 64 * 1024 * 1024), "65536", "largest /query or /internal/answer body accepted (larger: 413)")
    embed_cache_size: int = var("EMBED_CACHE_SIZE", _int_range(0, 10_000_000), "1024", "query embeddings each worker keeps (LRU; 0 = off): the same question skips the embedder")
    response_cache_size: int = var("RESPONSE_CACHE_SIZE", _int_range(0, 10_000_000), "0", "replies node 0 keeps by normalised query (0 = off: valid only while models and documents are fixed)")
    response_cache_ttl_s: float = var("RESPONSE_CACHE_TTL_S", _non_negative_float, "300", "how long a cached reply is served (s; 0 = until evicted or POST /cache/clear)")
    idempotency_cache_size: int = var("IDEMPOTENCY_CACHE_SIZE", _int_range(0, 10_000_000), "1024", "completed replies node 0 keeps to answer a repeated request_id without recomputing (0 = none)")
    idempotency_ttl_s: float = var("IDEMPOTENCY_TTL_S", _non_negative_float, "300", "how long a completed reply stays in that cache (s)")
    http_read_timeout_s: float = var("HTTP_READ_TIMEOUT_S", _non_negative_float, "0", "a request's headers and body must arrive within this many seconds of its first byte (a new connection's first request: of the connect), else the connection is closed; slow clients (slowloris) cannot hold connections; 0 = REQUEST_TIMEOUT_S / 30 within 2..30 s")
    http_connection_limit: int = var("HTTP_CONNECTION_LIMIT", _int_range(0, 1_000_000), "0", "open HTTP connections a node accepts at once (beyond: new ones wait unaccepted); 0 = the larger of 1024 and 4 per HTTP thread")
    # --- security
    cluster_token: str = var("CLUSTER_TOKEN", _token, "", "shared secret every internal endpoint (/search, /internal/answer) requires in X-Cluster-Token; empty = no check", secret=True)
    # --- tests only
    index_inject_delay_ms: float = var("INDEX_INJECT_DELAY_MS", _non_negative_float, "0", "TEST ONLY: node 2 sleeps this long before each /search (simulates a slow index server); keep 0")
    generate_inject_failure: str = var("GENERATE_INJECT_FAILURE", _choice("off", "iteration", "iteration_and_cleanup"), "off", "TEST ONLY: the continuous generate loop fails every iteration that has sequences (iteration_and_cleanup: its cleanup fails too), to test a dying stage thread; keep off")
    log_level: str = var("LOG_LEVEL", _choice("debug", "info", "warning", "error"), "info", "logging level")
    log_format: str = var("LOG_FORMAT", _choice("text", "json"), "text", "node log lines: text for people, json for log collectors (one object per line: time, node, level, logger, message and the request's fields)")
    # --- tracing (OpenTelemetry, opt-in; services/tracing.py)
    tracing: str = var("TRACING", _choice("off", "otlp", "jsonl"), "off", "OpenTelemetry tracing: off; otlp = export spans over OTLP/HTTP to TRACING_ENDPOINT; jsonl = append one JSON span per line to TRACING_FILE (W3C trace context crosses nodes 0 -> 1 -> 2 either way)")
    tracing_endpoint: str = var("TRACING_ENDPOINT", str, "http://127.0.0.1:4318/v1/traces", "OTLP/HTTP traces endpoint (a collector, Jaeger, Tempo) when TRACING=otlp")
    tracing_file: str = var("TRACING_FILE", str, "", "file spans are appended to when TRACING=jsonl (empty = logs/traces-node<N>.jsonl)")

    # ----------------------------------------------------------------- building

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Parse every variable; ConfigError with one line per bad value, then per disagreement.

        Every problem is reported at once, so an operator fixes them in one round: first each
        value that does not parse, then each consistency check whose variables all parsed.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        problems: list[str] = []
        unparsed: set[str] = set()
        for f in dataclasses.fields(cls):
            meta = f.metadata
            raw = env.get(meta["env"])
            raw = meta["default"] if raw is None else raw
            if f.name == "node_number" and not raw.strip():
                values[f.name] = None
                continue
            try:
                values[f.name] = meta["parse"](raw)
            except ValueError as exc:
                if f.name in overrides:
                    continue
                shown = raw if f.repr else "<hidden>"  # a secret's value never reaches a log
                problems.append(f"{meta['env']}={shown!r} is not valid: expected {exc}")
                unparsed.add(meta["env"])
                # The default stands in, so the checks that do not read this variable can still run.
                values[f.name] = None if f.name == "node_number" else meta["parse"](meta["default"])
        values.update(overrides)
        settings = cls(**values)
        for variables, check in _CONSISTENCY_CHECKS:
            if unparsed.isdisjoint(variables):
                problem = check(settings)
                if problem:
                    problems.append(problem)
        if problems:
            raise ConfigError(*problems)
        return settings

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)

    # Consistency checks: each returns its one-line problem or None (listed in _CONSISTENCY_CHECKS).

    def _check_worker_nodes(self) -> str | None:
        if any(n not in (0, 1) for n in self.worker_nodes):
            return (f"WORKER_NODES={','.join(map(str, self.worker_nodes))!r} is not valid: "
                    "expected worker nodes among 0 and 1")
        return None

    def _check_search_batch(self) -> str | None:
        # Node 2 queues a whole search batch at once: a batch larger than its queue could never be accepted.
        if self.search_max_batch > self.stage_max_queue:
            return (f"SEARCH_MAX_BATCH='{self.search_max_batch}' is not valid: expected at most "
                    f"STAGE_MAX_QUEUE ({self.stage_max_queue}), or node 2 could never queue a batch")
        return None

    def _check_internal_timeout(self) -> str | None:
        # Node 1 refuses a forwarded timeout_s above its cap: every forward would fail.
        if self.request_timeout_s > MAX_INTERNAL_TIMEOUT_S:
            return (f"REQUEST_TIMEOUT_S='{self.request_timeout_s:g}' is not valid: expected at most "
                    f"{MAX_INTERNAL_TIMEOUT_S:g}, MAX_INTERNAL_TIMEOUT_S, the longest timeout_s a worker "
                    "accepts on /internal/answer")
        return None

    def _check_joiners(self) -> str | None:
        if self.gateway_max_joiners_per_id > self.gateway_max_joiners:
            return (f"GATEWAY_MAX_JOINERS_PER_ID='{self.gateway_max_joiners_per_id}' is not valid: "
                    f"expected at most GATEWAY_MAX_JOINERS ({self.gateway_max_joiners})")
        return None

    def _check_read_timeout(self) -> str | None:
        if self.http_read_timeout_s >= self.request_timeout_s:
            return (f"HTTP_READ_TIMEOUT_S='{self.http_read_timeout_s:g}' is not valid: expected less than "
                    f"REQUEST_TIMEOUT_S ({self.request_timeout_s:g}), or 0 for the derived value")
        return None

    def _check_query_tokens(self) -> str | None:
        largest = self.max_query_tokens + PROMPT_ALLOWANCE_TOKENS + spec.MAX_NEW_TOKENS
        if self.generate_mode == "continuous" and largest * KV_SHARE_OF_LARGEST_REQUEST > self.generate_max_tokens:
            return (f"MAX_QUERY_TOKENS='{self.max_query_tokens}' is not valid: expected at most "
                    f"{self.generate_max_tokens // KV_SHARE_OF_LARGEST_REQUEST - PROMPT_ALLOWANCE_TOKENS - spec.MAX_NEW_TOKENS}"
                    f" with GENERATE_MAX_TOKENS={self.generate_max_tokens}, so that the largest request "
                    f"(its query, a {PROMPT_ALLOWANCE_TOKENS}-token prompt allowance and "
                    f"{spec.MAX_NEW_TOKENS} new tokens) reserves at most 1/{KV_SHARE_OF_LARGEST_REQUEST} "
                    "of the KV budget")
        return None

    def _check_channel_timeout(self) -> str | None:
        # Waitress must keep a connection at least as long as a request may be waited on.
        if not self.channel_timeout_s > self.request_timeout_s:
            return (f"REQUEST_TIMEOUT_S='{self.request_timeout_s:g}' is not valid: expected a value "
                    f"whose HTTP channel timeout ({self.channel_timeout_s:g} s) lies above it")
        return None

    # ----------------------------------------------------------------- views

    @staticmethod
    def variables() -> dict[str, dict]:
        """Environment variable name -> {field, default, help}, in declaration order."""
        return {
            f.metadata["env"]: {"field": f.name, "default": f.metadata["default"], "help": f.metadata["help"]}
            for f in dataclasses.fields(Settings)
        }

    def effective(self) -> dict[str, str]:
        """Environment variable name -> effective value as the string that sets it, in declaration
        order; a secret that is set reads "<hidden>" (what GET /settings and the startup line show)."""
        shown = {}
        for f in dataclasses.fields(self):
            text = render(getattr(self, f.name))
            shown[f.metadata["env"]] = HIDDEN if text and not f.repr else text
        return shown

    def non_defaults(self) -> dict[str, str]:
        """effective() restricted to the variables whose value differs from their default."""
        defaults = Settings.from_env({}).effective()
        return {name: value for name, value in self.effective().items() if value != defaults[name]}

    def node_address(self, node: int) -> Address:
        return (self.node_0_ip, self.node_1_ip, self.node_2_ip)[node]

    def batching(self, stage: str) -> BatchConfig:
        if stage not in STAGES:
            raise KeyError(stage)
        return BatchConfig(getattr(self, f"{stage}_max_batch"), getattr(self, f"{stage}_max_wait_ms"), self.stage_max_queue)

    def stage_dtype(self, stage: str) -> str:
        if stage not in MODEL_STAGES:
            raise KeyError(stage)
        return getattr(self, f"{stage}_dtype") or self.dtype

    def stage_dtype_variable(self, stage: str) -> str:
        return f"{stage.upper()}_DTYPE" if getattr(self, f"{stage}_dtype") else "DTYPE"

    def stage_precision(self, stage: str) -> str:
        if stage not in MODEL_STAGES:
            raise KeyError(stage)
        return getattr(self, f"{stage}_precision") or self.precision

    def stage_precision_variable(self, stage: str) -> str:
        return f"{stage.upper()}_PRECISION" if getattr(self, f"{stage}_precision") else "PRECISION"

    @property
    def channel_timeout_s(self) -> float:
        """Waitress's channel timeout: above the request timeout (CHANNEL_TIMEOUT_MARGIN_S)."""
        return self.request_timeout_s + CHANNEL_TIMEOUT_MARGIN_S

    @property
    def read_timeout_s(self) -> float:
        """HTTP_READ_TIMEOUT_S, or derived from REQUEST_TIMEOUT_S (READ_TIMEOUT_SHARE) when 0."""
        if self.http_read_timeout_s:
            return self.http_read_timeout_s
        return min(MAX_READ_TIMEOUT_S, max(MIN_READ_TIMEOUT_S, self.request_timeout_s / READ_TIMEOUT_SHARE))

    def connection_limit(self, http_threads: int) -> int:
        """HTTP_CONNECTION_LIMIT, or derived from the node's HTTP threads when 0."""
        return self.http_connection_limit or max(MIN_CONNECTION_LIMIT, 4 * http_threads)

    @property
    def documents_db(self) -> Path:
        return self.documents_dir / "documents.db"

    @property
    def standin_dir(self) -> Path:
        return self.standin_home or (REPO_ROOT / ".cache" / "standins" / self.standin_profile)

    # ----------------------------------------------------------------- role checks

    def require_node_number(self) -> int:
        if self.node_number is None:
            raise ConfigError("NODE_NUMBER='' is not valid: expected an integer from 0 to 2 to start a node")
        return self.node_number

    def require_index_file(self) -> Path:
        if not self.faiss_index_path.is_file():
            raise ConfigError(f"FAISS_INDEX_PATH={str(self.faiss_index_path)!r} is not valid: expected an existing FAISS index file")
        return self.faiss_index_path

    def require_documents(self) -> Path:
        if not self.documents_db.is_file():
            raise ConfigError(f"DOCUMENTS_DIR={str(self.documents_dir)!r} is not valid: expected a folder holding documents.db")
        return self.documents_db


# Each consistency check with the variables it reads: it runs only when all of them parsed.
_CONSISTENCY_CHECKS: tuple[tuple[frozenset[str], Callable[[Settings], str | None]], ...] = (
    (frozenset({"WORKER_NODES"}), Settings._check_worker_nodes),
    (frozenset({"SEARCH_MAX_BATCH", "STAGE_MAX_QUEUE"}), Settings._check_search_batch),
    (frozenset({"REQUEST_TIMEOUT_S"}), Settings._check_internal_timeout),
    (frozenset({"GATEWAY_MAX_JOINERS_PER_ID", "GATEWAY_MAX_JOINERS"}), Settings._check_joiners),
    (frozenset({"HTTP_READ_TIMEOUT_S", "REQUEST_TIMEOUT_S"}), Settings._check_read_timeout),
    (frozenset({"MAX_QUERY_TOKENS", "GENERATE_MAX_TOKENS", "GENERATE_MODE"}), Settings._check_query_tokens),
    (frozenset({"REQUEST_TIMEOUT_S"}), Settings._check_channel_timeout),
)


def render(value: Any) -> str:
    """A parsed value as the environment string that sets it (Settings.effective)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


# ---- misspelt variables: a name that looks like ours but is not one is most likely a typo that
# would otherwise be ignored in silence (the default applies and nobody notices).

# Other software's variables that share a word with ours (HF_HOME beside HF_HUB_OFFLINE, TORCH_HOME
# beside TORCH_THREADS, HTTP_PROXY beside HTTP_READ_TIMEOUT_S): never "ours by the look of it".
FOREIGN_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH", "OTEL_", "PYTHON", "PYTEST",
                    "OMP_", "MKL_", "KMP_", "CUDA_", "NVIDIA_", "LC_", "XDG_", "SSH_", "GIT_", "HTTP_PROXY",
                    "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "LD_", "VIRTUAL_ENV", "CONDA_", "PIP_", "DEMO_DIR",
                    "DEMO_DOCS")
# How close (difflib ratio) an unknown name must be to one of ours to be called a typo of it;
# a foreign-looking name must be closer still (HF_HUB_OFLINE is, HF_HUB_CACHE is not).
TYPO_RATIO, FOREIGN_TYPO_RATIO = 0.8, 0.9


def _our_affixes() -> tuple[set[str], set[str]]:
    """The first word of each of our names ending in a stage or knob word (EMBED_, GATEWAY_...) and
    the endings several of ours share (_MAX_BATCH, _DTYPE, _TIMEOUT_S...)."""
    names = list(Settings.variables())
    prefixes = {name.split("_")[0] + "_" for name in names if "_" in name}
    # Words that are ours alone (NODE_ is not: Node.js has NODE_OPTIONS; a typo of NODE_1_IP is close anyway).
    prefixes &= {f"{stage.upper()}_" for stage in STAGES} | {"GATEWAY_", "STANDIN_", "FAISS_", "LOCAL_",
                                                              "TRACING_", "RESPONSE_", "IDEMPOTENCY_",
                                                              "CLUSTER_", "SHUTDOWN_", "WAITRESS_"}
    endings = ("_MAX_BATCH", "_MAX_WAIT_MS", "_DTYPE", "_PRECISION", "_CACHE_SIZE", "_INJECT_DELAY_MS")
    suffixes = {end for end in endings if sum(name.endswith(end) for name in names) >= 2}
    return prefixes, suffixes


def misspelt_variables(env: Mapping[str, str] | None = None) -> list[str]:
    """One warning per variable in `env` that is not ours but looks like it, naming the closest of ours."""
    env = os.environ if env is None else env
    ours = list(Settings.variables())
    prefixes, suffixes = _our_affixes()
    warnings = []
    for name in sorted(env):
        if name in ours or not name.isupper():
            continue
        foreign = name.startswith(FOREIGN_PREFIXES)
        close = difflib.get_close_matches(name, ours, n=1, cutoff=FOREIGN_TYPO_RATIO if foreign else TYPO_RATIO)
        if not close and not foreign:  # one of our words: the closest of ours sharing it
            kin = [our for our in ours if any(name.startswith(p) and our.startswith(p) for p in prefixes)
                   or any(name.endswith(x) and our.endswith(x) for x in suffixes)]
            close = difflib.get_close_matches(name, kin, n=1, cutoff=0.0)
        if close:
            warnings.append(f"{name} is not a setting this service reads (ignored); did you mean {close[0]}? "
                            "(env.example lists them all)")
    return warnings


def describe(settings: Settings, env: Mapping[str, str]) -> list[str]:
    """One line per variable: NAME=effective value, and whether that is the default."""
    defaults = Settings.from_env({}).effective()
    lines = []
    for name, value in settings.effective().items():
        if value == defaults[name]:
            origin = "default" if name not in env else "set, equal to the default"
        else:
            origin = f"set (default: {defaults[name] or 'empty'})"
        lines.append(f"{name}={value}".ljust(48) + f"  # {origin}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.config` (`./run.sh settings`): the effective settings; exit 2 on bad values."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m pipeline.config", description=main.__doc__)
    parser.add_argument("--non-default", action="store_true", help="only the variables not at their default")
    args = parser.parse_args(argv)
    for warning in misspelt_variables():
        print(f"warning: {warning}", file=sys.stderr)
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"{CONFIG_ERROR_PREFIX}{exc}", file=sys.stderr)
        return 2
    lines = describe(settings, os.environ)
    if args.non_default:
        lines = [line for line in lines if "# set (default" in line] or ["# every setting is at its default"]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
