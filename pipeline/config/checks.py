"""Consistency checks between settings: each yields its one-line problem, if it has one. Each names the
variables it reads and runs only when all of them parsed (a bad value is reported once, as itself)."""
from __future__ import annotations

import ipaddress
from typing import Callable, Iterator

from pipeline import spec
from pipeline.config.sections import Sections

# The longest /internal/answer `timeout_s` a worker accepts (a sanity bound on what another
# node sends). The gateway forwards up to REQUEST_TIMEOUT_S, so that must not exceed it.
MAX_INTERNAL_TIMEOUT_S = 3600.0
# MAX_QUERY_TOKENS must leave room in the KV budget (GENERATE_KV_CACHE_TOKENS) for the
# conversation (MAX_HISTORY_TOKENS), the prompt around the query (system prompt, three
# 200-character context lines: a generous allowance) and the 128 new tokens, so that the largest request reserves at most a quarter
# of the budget and never makes every other request wait behind its prefill.
PROMPT_ALLOWANCE_TOKENS = 512
KV_SHARE_OF_LARGEST_REQUEST = 4


def _nodes(nodes: tuple[int, ...]) -> str:
    return ",".join(map(str, nodes))


def _node_number(s: Sections) -> Iterator[str]:
    c = s.cluster
    if c.node_number is not None and c.node_number >= c.total_nodes:
        yield (f"NODE_NUMBER='{c.node_number}' is not valid: expected a node below TOTAL_NODES ({c.total_nodes}), "
               f"from 0 to {c.total_nodes - 1}")


def _index_nodes(s: Sections) -> Iterator[str]:
    c = s.cluster
    beyond = [n for n in c.index_nodes if n >= c.total_nodes]
    if 0 in c.index_nodes:
        yield (f"INDEX_NODES={_nodes(c.index_nodes)!r} is not valid: node 0 is the gateway and a worker; "
               "expected index nodes among 1 and above")
    elif beyond:
        yield (f"INDEX_NODES={_nodes(c.index_nodes)!r} is not valid: node {beyond[0]} is not below "
               f"TOTAL_NODES ({c.total_nodes})")


def _index_shards(s: Sections) -> Iterator[str]:
    c = s.cluster
    if c.index_shards > len(c.index_nodes):
        yield (f"INDEX_SHARDS='{c.index_shards}' is not valid: expected at most the {len(c.index_nodes)} "
               f"INDEX_NODES ({_nodes(c.index_nodes)}), one node at least per shard")


def _worker_nodes(s: Sections) -> Iterator[str]:
    c = s.cluster
    not_workers = [n for n in c.worker_nodes if n not in c.workers]
    if not_workers:
        n = not_workers[0]
        what = (f"an index node (INDEX_NODES={_nodes(c.index_nodes)})" if n in c.index_nodes
                else f"not below TOTAL_NODES ({c.total_nodes})")
        yield (f"WORKER_NODES={_nodes(c.worker_nodes)!r} is not valid: node {n} is {what}; expected workers "
               f"among {_nodes(c.workers)}, or empty for all of them")


def _node_addresses(s: Sections) -> Iterator[str]:
    c = s.cluster
    beyond = [n for n in c.more_node_ips if n >= c.total_nodes]
    if beyond:
        yield (f"NODE_{beyond[0]}_IP is set but TOTAL_NODES is {c.total_nodes}: expected node addresses "
               f"below {c.total_nodes}, or a larger TOTAL_NODES")
        return
    seen: dict = {}
    for n in c.nodes:
        address = c.node_address(n)
        if address in seen:
            yield (f"NODE_{n}_IP='{address}' is not valid: node {seen[address]} has the same address; "
                   "expected one host:port per node")
            return
        seen[address] = n


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: only "localhost" is known to stay on this machine
        return host == "localhost"


def _cluster_token(s: Sections) -> Iterator[str]:
    # Beyond loopback, anyone who reaches the port could call the internal endpoints
    # (/search, /internal/answer, /cache/clear): a node that listens there needs the shared secret.
    c = s.cluster
    if c.node_number is None or c.cluster_token:
        return
    host = c.bind_address(c.node_number).host
    if not _is_loopback(host):
        yield (f"CLUSTER_TOKEN='' is not valid: node {c.node_number} listens on {host}, beyond loopback; expected "
               "the same secret on every node (e.g. `openssl rand -hex 32`), which the internal endpoints require")


def _index_discovery(s: Sections) -> Iterator[str]:
    c = s.cluster
    if c.index_discovery and len(c.index_discovery) != c.index_shards:
        yield (f"INDEX_DISCOVERY={','.join(map(str, c.index_discovery))!r} is not valid: expected one name per "
               f"shard, {c.index_shards} (INDEX_SHARDS), in shard order")


def _search_batch(s: Sections) -> Iterator[str]:
    # Node 2 queues a whole search batch at once: a batch larger than its queue could never be accepted.
    if s.search.max_batch > s.limits.stage_max_queue:
        yield (f"SEARCH_MAX_BATCH='{s.search.max_batch}' is not valid: expected at most "
               f"STAGE_MAX_QUEUE ({s.limits.stage_max_queue}), or node 2 could never queue a batch")


def _internal_timeout(s: Sections) -> Iterator[str]:
    # Node 1 refuses a forwarded timeout_s above its cap: every forward would fail.
    if s.limits.request_timeout_s > MAX_INTERNAL_TIMEOUT_S:
        yield (f"REQUEST_TIMEOUT_S='{s.limits.request_timeout_s:g}' is not valid: expected at most "
               f"{MAX_INTERNAL_TIMEOUT_S:g}, MAX_INTERNAL_TIMEOUT_S, the longest timeout_s a worker "
               "accepts on /internal/answer")


def _joiners(s: Sections) -> Iterator[str]:
    if s.gateway.max_joiners_per_id > s.gateway.max_joiners:
        yield (f"GATEWAY_MAX_JOINERS_PER_ID='{s.gateway.max_joiners_per_id}' is not valid: "
               f"expected at most GATEWAY_MAX_JOINERS ({s.gateway.max_joiners})")


def _read_timeout(s: Sections) -> Iterator[str]:
    if s.http.read_timeout_s >= s.limits.request_timeout_s:
        yield (f"HTTP_READ_TIMEOUT_S='{s.http.read_timeout_s:g}' is not valid: expected less than "
               f"REQUEST_TIMEOUT_S ({s.limits.request_timeout_s:g}), or 0 for the derived value")


def _query_tokens(s: Sections) -> Iterator[str]:
    new_tokens = max(spec.MAX_NEW_TOKENS, s.api.max_tokens_cap)  # /v1 answers may be longer than /query's
    history = s.limits.max_history_tokens
    largest = s.limits.max_query_tokens + history + PROMPT_ALLOWANCE_TOKENS + new_tokens
    budget = s.generate.kv_cache_tokens
    if largest * KV_SHARE_OF_LARGEST_REQUEST > budget:
        most = budget // KV_SHARE_OF_LARGEST_REQUEST - history - PROMPT_ALLOWANCE_TOKENS - new_tokens
        yield (f"MAX_QUERY_TOKENS='{s.limits.max_query_tokens}' is not valid: expected at most {most}"
               f" with GENERATE_KV_CACHE_TOKENS={budget}, so that the largest request "
               f"(its query, its conversation (MAX_HISTORY_TOKENS={history}), a {PROMPT_ALLOWANCE_TOKENS}-token "
               "prompt allowance and "
               f"{new_tokens} new tokens, OPENAI_MAX_TOKENS_CAP) reserves at most 1/{KV_SHARE_OF_LARGEST_REQUEST} "
               "of the KV budget")


def _channel_timeout(s: Sections) -> Iterator[str]:
    # Waitress must keep a connection at least as long as a request may be waited on.
    if not s.channel_timeout_s > s.limits.request_timeout_s:
        yield (f"REQUEST_TIMEOUT_S='{s.limits.request_timeout_s:g}' is not valid: expected a value "
               f"whose HTTP channel timeout ({s.channel_timeout_s:g} s) lies above it")


# Each check with the variables it reads.
CHECKS: tuple[tuple[frozenset[str], Callable[[Sections], Iterator[str]]], ...] = (
    (frozenset({"NODE_NUMBER", "TOTAL_NODES"}), _node_number),
    (frozenset({"INDEX_NODES", "TOTAL_NODES"}), _index_nodes),
    (frozenset({"INDEX_SHARDS", "INDEX_NODES"}), _index_shards),
    (frozenset({"WORKER_NODES", "INDEX_NODES", "TOTAL_NODES"}), _worker_nodes),
    (frozenset({"TOTAL_NODES", "NODE_0_IP", "NODE_1_IP", "NODE_2_IP", "NODE_<n>_IP"}), _node_addresses),
    (frozenset({"CLUSTER_TOKEN", "NODE_NUMBER", "BIND_HOST", "NODE_<n>_IP"}), _cluster_token),
    (frozenset({"INDEX_DISCOVERY", "INDEX_SHARDS"}), _index_discovery),
    (frozenset({"SEARCH_MAX_BATCH", "STAGE_MAX_QUEUE"}), _search_batch),
    (frozenset({"REQUEST_TIMEOUT_S"}), _internal_timeout),
    (frozenset({"GATEWAY_MAX_JOINERS_PER_ID", "GATEWAY_MAX_JOINERS"}), _joiners),
    (frozenset({"HTTP_READ_TIMEOUT_S", "REQUEST_TIMEOUT_S"}), _read_timeout),
    (frozenset({"MAX_QUERY_TOKENS", "MAX_HISTORY_TOKENS", "GENERATE_KV_CACHE_TOKENS", "OPENAI_MAX_TOKENS_CAP"}),
     _query_tokens),
    (frozenset({"REQUEST_TIMEOUT_S"}), _channel_timeout),
)


def disagreements(settings: Sections, unparsed: set[str]) -> list[str]:
    """The problems of every check whose variables all parsed."""
    return [problem for variables, check in CHECKS if unparsed.isdisjoint(variables) for problem in check(settings)]
