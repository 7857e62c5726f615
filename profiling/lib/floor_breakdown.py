"""A request's time per component of the service, read from what the nodes record, not guessed
(profiling/overhead_floor.py): each node's completion lines (services/server/edge.py: latency_ms,
served_by, stages_ms per request) and the stages' counters in /metrics (queue wait, batch run time).

Components, each a mean over the requests of one load level, in ms:

* `client and HTTP to node 0`: the client's latency less node 0's own (waitress, the client, JSON);
* `node 0: edge and routing` (requests node 0's own worker served: its edge, the gateway and the worker
  outside its stages) and `relay to node 1` (node 1's: node 0's time less node 1's: routing, the HTTP
  hop, the SSE relay), `node 1: edge and worker outside stages`;
* per stage on the request's critical path (sentiment and toxicity run at once: the longer counts):
  its queue wait and its batch run (the stage's counters over the level: mean wait per item, mean
  run per batch) and the rest, `handoff` (submitting, the thread switch and the future's wake-up);
  generate's run is its decoding: the engine's mean iteration times the tokens a request generates
  (its handoff then holds the tokens' way to the request's thread too);
* the index call's share of search: node 2's /search handling time, of which its own queue and faiss;
* the host CPU a request costs each node (its process's CPU seconds over the level,
  `rag_process_cpu_seconds_total`, per request answered; for a commit before it, `process_cpu_seconds_total`, in
  10 ms ticks): what the service's own code costs, whatever the device, where the times above on a machine whose
  cores the nodes and the load share also hold the waits for a core.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from profiling.lib.prometheus import MetricsSnapshot, counter_delta

# services/server/edge.py's line: request done id=... request_id='x' /query status=200 latency_ms=1.2 served_by=1 ...
COMPLETION = re.compile(r"request done id=\S+ request_id=(?P<rid>'[^']*'|None) (?P<endpoint>\S+) status=(?P<status>\d+) "
                        r"latency_ms=(?P<latency>[\d.]+) served_by=(?P<served>\S+) stages_ms=(?P<stages>\S+)")
CRITICAL_STAGES = ("embed", "search", "fetch", "rerank", "generate")
BOTH = ("sentiment", "toxicity")  # run at once


@dataclass(frozen=True)
class CompletionLine:
    request_id: str
    endpoint: str
    status: int
    latency_ms: float
    served_by: int | None
    stages_ms: dict[str, float] = field(default_factory=dict)


def parse_completions(text: str) -> list[CompletionLine]:
    """Every completion line in a node's log text."""
    lines = []
    for match in COMPLETION.finditer(text):
        stages = {}
        if match["stages"] != "-":
            for part in match["stages"].split(","):
                name, _, ms = part.partition(":")
                stages[name] = float(ms)
        served = match["served"]
        lines.append(CompletionLine(match["rid"].strip("'"), match["endpoint"], int(match["status"]),
                                    float(match["latency"]), int(served) if served.isdigit() else None, stages))
    return lines


def critical_path_ms(stages: Mapping[str, float]) -> float:
    return sum(stages.get(s, 0.0) for s in CRITICAL_STAGES) + max((stages.get(s, 0.0) for s in BOTH), default=0.0)


def _mean(values: Iterable[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def _per(num: float | None, den: float | None) -> float:
    return 1000 * num / den if num is not None and den else math.nan


def stage_counters(before: Sequence[MetricsSnapshot], after: Sequence[MetricsSnapshot], stage: str) -> dict[str, float]:
    """Mean queue wait per item and mean run per batch (ms) of `stage`, over every node that runs it."""
    wait = items = run = batches = 0.0
    for b, a in zip(before, after):
        wait += counter_delta(b, a, "rag_batch_wait_seconds_total", stage=stage) or 0.0
        items += counter_delta(b, a, "rag_batch_items_total", stage=stage) or 0.0
        run += counter_delta(b, a, "rag_batch_run_seconds_total", stage=stage) or 0.0
        batches += counter_delta(b, a, "rag_batches_total", stage=stage) or 0.0
    return {"queue_wait_ms": _per(wait, items), "batch_run_ms": _per(run, batches), "batches": batches,
            "items": items}


def _engine_steps(before: Sequence[MetricsSnapshot], after: Sequence[MetricsSnapshot]) -> dict[str, float]:
    """The generate stage's mean engine iteration (ms: its run seconds over its decode steps) and the
    tokens a finished sequence generated, over every worker."""
    run = steps = tokens = finished = 0.0
    for b, a in zip(before, after):
        run += counter_delta(b, a, "rag_batch_run_seconds_total", stage="generate") or 0.0
        steps += counter_delta(b, a, "rag_generate_decode_steps_total", stage="generate") or 0.0
        tokens += counter_delta(b, a, "rag_generate_tokens_total", stage="generate") or 0.0
        finished += counter_delta(b, a, "rag_generate_finished_sequences_total", stage="generate") or 0.0
    return {"step_ms": _per(run, steps), "tokens_per_request": tokens / finished if finished else math.nan}


def http_mean_ms(before: MetricsSnapshot, after: MetricsSnapshot, endpoint: str) -> float:
    total = counter_delta(before, after, "rag_http_request_duration_seconds_sum", endpoint=endpoint)
    count = counter_delta(before, after, "rag_http_request_duration_seconds_count", endpoint=endpoint)
    return _per(total, count)


def answered_lines(node0: Sequence[CompletionLine], node1: Sequence[CompletionLine]
                   ) -> tuple[dict[str, CompletionLine], dict[str, CompletionLine]]:
    """By request id: node 0's answered /query lines, and node 1's answered /internal/answer lines (the
    requests node 0 relayed to it)."""
    front = {line.request_id: line for line in node0 if line.endpoint == "/query" and line.status == 200}
    relayed = {line.request_id: line for line in node1 if line.endpoint == "/internal/answer" and line.status == 200}
    return front, relayed


def unlogged(answered: Iterable[str], node0: Sequence[CompletionLine], node1: Sequence[CompletionLine]) -> list[str]:
    """The answered request ids whose completion lines (node 0's, and node 1's for a relayed one) are not yet
    written: a node writes its line after the reply's last byte, so a client can hold its answer first."""
    front, relayed = answered_lines(node0, node1)
    return [rid for rid in answered if rid not in front or (front[rid].served_by == 1 and rid not in relayed)]


def breakdown(client_ms: Mapping[str, float], node0: Sequence[CompletionLine], node1: Sequence[CompletionLine],
              before: Sequence[MetricsSnapshot], after: Sequence[MetricsSnapshot], index_node: int = 2) -> dict:
    """{component: mean ms per request} of one level: `client_ms` by request id (successful requests),
    node 0's and node 1's completion lines, every node's /metrics before and after (by node number)."""
    front, relayed = answered_lines(node0, node1)
    rows = [(rid, ms, front[rid]) for rid, ms in client_ms.items() if rid in front]
    out: dict[str, float] = {"requests (count)": float(len(rows)),
                             "served by node 1 (count)": float(sum(1 for _, _, f in rows if f.served_by == 1))}
    out["client and HTTP to node 0"] = _mean(ms - f.latency_ms for _, ms, f in rows)
    out["node 0: edge and routing (own worker's requests)"] = _mean(
        f.latency_ms - critical_path_ms(f.stages_ms) for _, _, f in rows if f.served_by == 0)
    out["relay to node 1"] = _mean(f.latency_ms - relayed[rid].latency_ms for rid, _, f in rows
                                   if f.served_by == 1 and rid in relayed)
    out["node 1: edge and worker outside stages"] = _mean(
        relayed[rid].latency_ms - critical_path_ms(relayed[rid].stages_ms) for rid, _, f in rows
        if f.served_by == 1 and rid in relayed)
    workers = [i for i in range(len(after)) if i != index_node]
    for stage in (*CRITICAL_STAGES, *BOTH):
        total = _mean(f.stages_ms.get(stage, math.nan) for _, _, f in rows)
        counters = stage_counters([before[i] for i in workers], [after[i] for i in workers], stage)
        out[f"{stage}: in stage"] = total
        out[f"{stage}: queue wait"] = counters["queue_wait_ms"]
        if stage == "generate":  # continuous: its run is every engine step, not one batch per item
            steps = _engine_steps([before[i] for i in workers], [after[i] for i in workers])
            out["generate: engine step (mean)"] = steps["step_ms"]
            out["generate: steps per request"] = steps["tokens_per_request"]
            ran = steps["step_ms"] * steps["tokens_per_request"]
            out["generate: decoding (steps x step)"] = ran
        else:
            ran = counters["batch_run_ms"]
            out[f"{stage}: batch run"] = ran
        out[f"{stage}: handoff"] = total - counters["queue_wait_ms"] - ran
    answered = len(client_ms)
    cpu = [counter_delta(b, a, "rag_process_cpu_seconds_total", "process_cpu_seconds_total") for b, a in zip(before, after)]
    for node, seconds in enumerate(cpu):
        out[f"node {node}: CPU ms per request"] = _per(seconds, answered)
    known = [c for c in cpu if c is not None]
    out["nodes: CPU ms per request"] = _per(sum(known), answered) if known else math.nan
    if index_node < len(after):
        b, a = before[index_node], after[index_node]
        index = stage_counters([b], [a], "index")
        out["index call: node 2 /search"] = http_mean_ms(b, a, "/search")
        out["index call: node 2 queue wait"] = index["queue_wait_ms"]
        out["index call: node 2 faiss batch"] = index["batch_run_ms"]
    return out
