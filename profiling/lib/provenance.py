"""What a result was measured with: the code, every node's settings, and caches that could answer.

A figure means nothing without what produced it: caches, precision, batch limits, threads, the model source and the
code all change it. Each node answers `GET /settings` with `{"settings": {ENV_NAME: value, ...}}` (secrets
"<hidden>"); a node that predates it (404) or cannot answer is recorded as unknown, with a printed warning, so the
tools still work. `rag_node_info` in /metrics (role, model source, precision, version) is recorded too. In-process
tools record this process's own settings instead."""
from __future__ import annotations

import subprocess
from typing import Any, Mapping, Sequence

import requests

from pipeline.config import REPO_ROOT, Settings
from profiling.lib.prometheus import MetricsSnapshot, Node
from services.server.token import TOKEN_HEADER

UNKNOWN = "unknown"
SETTINGS_TIMEOUT_S = 10.0
# The caches that can answer a repeated query without computing it, and the nodes they live on.
WORKER_CACHE, GATEWAY_CACHE = "EMBED_CACHE_SIZE", "RESPONSE_CACHE_SIZE"
# Printed in one line per node (every setting is in the result file).
HEADLINE = ("MODEL_SOURCE", "STANDIN_PROFILE", "PRECISION", "GENERATE_MAX_BATCH",
            "TORCH_THREADS", "FAISS_THREADS", WORKER_CACHE, GATEWAY_CACHE)


def git_commit(cwd=REPO_ROOT) -> dict[str, Any]:
    """The tool's own code: HEAD's commit and whether tracked files differ from it ('unknown' outside git)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit or UNKNOWN, "dirty": None if status is None else bool(status)}


def fetch_settings(node: Node, token: str = "", timeout_s: float = SETTINGS_TIMEOUT_S) -> tuple[dict | None, str]:
    """(the node's settings, '') or (None, why they are unknown)."""
    try:
        response = requests.get(f"{node.url}/settings", headers={TOKEN_HEADER: token} if token else {},
                                timeout=timeout_s)
    except requests.RequestException as exc:
        return None, f"{type(exc).__name__} from {node.url}/settings"
    if response.status_code != 200:
        why = " (a node older than GET /settings)" if response.status_code == 404 else ""
        return None, f"{node.url}/settings answered {response.status_code}{why}"
    try:
        return {str(k): str(v) for k, v in response.json()["settings"].items()}, ""
    except (ValueError, KeyError, TypeError, AttributeError):  # not JSON, or not {"settings": {...}}
        return None, f"{node.url}/settings is not {{\"settings\": {{...}}}}"


def node_info(snapshot: MetricsSnapshot) -> dict[str, str]:
    """rag_node_info's labels (role, model_source, precision, version); {} when not exported."""
    return next((dict(labels) for name, labels in snapshot.samples if name == "rag_node_info"), {})


def queries_repeat(queries: Sequence[str], requests_planned: int) -> bool:
    """Whether some query is sent twice: the loops cycle through the query list."""
    return requests_planned > len(queries) or len(set(queries[:requests_planned])) < requests_planned


def cache_warnings(nodes: Sequence[Node], settings: Sequence[dict | None], queries: Sequence[str],
                   requests_planned: int) -> list[str]:
    """One line per cache that could answer a repeated query instead of computing it.

    The embedding cache lives on the workers, the reply cache on node 0; unknown settings
    (no /settings) warn too, since a cache may be on."""
    if not queries_repeat(queries, requests_planned):
        return []
    what = (f"the query set repeats ({len(set(queries))} distinct queries, {requests_planned} requests planned): "
            "repeats may be answered from the cache, not computed")
    warnings = []
    for node, values in zip(nodes, settings):
        if node.role == "index" or (not node.role and node.node == 2):
            continue  # the index node has no cache
        names = [WORKER_CACHE] + ([GATEWAY_CACHE] if node.node == 0 else [])
        if values is None:
            warnings.append(f"node {node.node}: cache settings unknown ({' / '.join(names)}); if one is > 0, {what}")
            continue
        for name in names:
            value = values.get(name, UNKNOWN)
            if value == UNKNOWN or not value.strip().isdigit() or int(value) > 0:
                warnings.append(f"node {node.node}: {name}={value} and {what}")
    return warnings


def cluster_record(nodes: Sequence[Node], snapshots: Sequence[MetricsSnapshot], token: str = "") -> dict[str, Any]:
    """The tool's commit and, per node, its settings (or why unknown: settings_warnings) and rag_node_info."""
    record: dict[str, Any] = {"tool": git_commit(), "nodes": []}
    for node, snapshot in zip(nodes, snapshots):
        values, why = fetch_settings(node, token)
        record["nodes"].append({"node": node.node, "url": node.url, "role": node.role, "info": node_info(snapshot),
                                "settings": values if values is not None else UNKNOWN, "settings_note": why})
    return record


def settings_warnings(record: Mapping[str, Any], nodes: Sequence[Node] = (), queries: Sequence[str] = (),
                      requests_planned: int = 0) -> list[str]:
    """One line per node whose settings could not be read, then the cache_warnings for these queries."""
    known = [n["settings"] if isinstance(n["settings"], dict) else None for n in record.get("nodes", [])]
    unknown = [f"node {n['node']}'s settings are unknown ({n['settings_note']}): recorded as {UNKNOWN!r}"
               for n, values in zip(record.get("nodes", []), known) if values is None]
    return unknown + cache_warnings(nodes, known, queries, requests_planned)


def local_record(env: Mapping[str, str] | None = None, settings: Settings | None = None) -> dict[str, Any]:
    """For in-process tools: the commit and this process's settings as GET /settings gives them
    (`settings` when the tool already built them, else from `env`; secrets hidden)."""
    values = (settings or Settings.from_env(env)).effective()
    return {"tool": git_commit(), "settings": values, "settings_source": "this process's environment"}


def headline(record: Mapping[str, Any]) -> str:
    """A few lines naming the code and the settings that most change figures (all are in the file)."""
    tool = record["tool"]
    lines = [f"code: {tool['commit'][:12]}" + (" (uncommitted changes)" if tool.get("dirty") else "")]
    per_node = [(f"node {n['node']}", n["settings"], n.get("info", {})) for n in record.get("nodes", [])]
    if "settings" in record:
        per_node.append(("this process", record["settings"], {}))
    for who, values, info in per_node:
        if isinstance(values, dict):
            shown = " ".join(f"{k}={values[k]}" for k in HEADLINE if k in values)
        else:
            shown = "settings unknown" + (" (rag_node_info: " + ", ".join(f"{k}={v}" for k, v in info.items()
                                                                      if k != "node") + ")" if info else "")
        lines.append(f"{who}: {shown}" + (f" version={info['version']}" if info.get("version") else ""))
    return "\n".join(lines)
