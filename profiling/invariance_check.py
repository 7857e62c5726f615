"""The whole service's batch invariance, checked where it serves: a reply alone equals the same
request's reply among 8 concurrent others, greedy and seeded sampling, per precision.

    python -m profiling.invariance_check [--precisions auto,fast] [--targets 3] [--docs 300] [--out DIR]
                                         [--budget-s 1500] [--tiny]

Builds the stand-ins (faithful by default: the real models' shapes) and a support corpus, then per
precision starts three nodes on 127.0.0.1 (the launcher's command line, the embedding cache off so
every query is embedded) and, per mode (greedy; sampled at temperature 0.8, top_p 0.95, a seed per
request): each target request alone, one after another, then every target at once with fillers, so
each target shares its batches with 8 other requests. A target's two replies must be equal: /query's
answer, sentiment, toxicity and sources (greedy: /query is), the chat completion's choices (sampled). Every request has its own request_id, so nothing is served from a
cache. Prints one line per precision and mode; exits 1 where any reply differs or a request failed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from pipeline.spec import GENERATOR_MODEL, REFERENCE_QUERIES
from profiling.lib import local_cluster
from services.cluster.health_wait import wait_healthy

ROOT = local_cluster.ROOT
AMONG = 8  # each target's batch-mates
MODES = {"greedy": {}, "seeded": {"temperature": 0.8, "top_p": 0.95}}
GENERATOR = GENERATOR_MODEL  # the chat completions' model name
COMPARED = ("generated_response", "sentiment", "is_toxic", "sources")  # /query's


def bodies(targets: int, mode: str) -> tuple[list[dict], list[dict]]:
    """The target requests and the fillers beside them (other questions), each with its own id and,
    sampled, its own seed."""
    queries = list(REFERENCE_QUERIES)
    fillers_needed = max(0, AMONG + 1 - targets)
    asked = [queries[i % len(queries)] + ("" if i < len(queries) else f" (case {i})")
             for i in range(targets + fillers_needed)]
    stamp = time.time_ns()
    made = [{"request_id": f"inv-{mode}-{stamp}-{i}", "query": q, **MODES[mode],
             **({"seed": 1000 + i} if MODES[mode] else {})} for i, q in enumerate(asked)]
    return made[:targets], made[targets:]


def ask(url: str, body: dict, suffix: str, timeout: float) -> dict:
    """The reply's compared fields: /query's for a greedy body (/query is always greedy), the chat
    completion's choices for a sampled one (its request id sent as X-Request-Id)."""
    request_id = body["request_id"] + suffix
    if "seed" not in body:
        response = requests.post(f"{url}/query", json={**body, "request_id": request_id}, timeout=timeout)
        response.raise_for_status()
        reply = response.json()
        return {k: reply.get(k) for k in COMPARED}
    sampled = {k: v for k, v in body.items() if k not in ("request_id", "query")}
    response = requests.post(f"{url}/v1/chat/completions", headers={"X-Request-Id": request_id}, timeout=timeout,
                             json={"model": GENERATOR, "messages": [{"role": "user", "content": body["query"]}], **sampled})
    response.raise_for_status()
    return {"choices": response.json()["choices"]}


def compare(url: str, targets: list[dict], fillers: list[dict], timeout: float) -> dict:
    """Each target alone, then all targets and fillers at once: which targets' replies differ."""
    alone = [ask(url, body, "-alone", timeout) for body in targets]
    everyone = targets + fillers
    with ThreadPoolExecutor(len(everyone)) as pool:
        among = list(pool.map(lambda body: ask(url, body, "-among", timeout), everyone))[:len(targets)]
    differ = [t["request_id"] for t, a, b in zip(targets, alone, among) if a != b]
    return {"targets": len(targets), "in_flight": len(everyone), "differ": differ, "alone": alone}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m profiling.invariance_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--precisions", default="auto,fast", help="PRECISION values, comma-separated")
    p.add_argument("--targets", type=int, default=3, help="requests compared alone and among 8 others")
    p.add_argument("--docs", type=int, default=300, help="support documents in the corpus")
    p.add_argument("--budget-s", type=float, default=1500.0, help="the whole check's time limit (s)")
    p.add_argument("--out", default=str(ROOT / "runs" / time.strftime("invariance-%Y%m%dT%H%M%SZ", time.gmtime())))
    p.add_argument("--tiny", action="store_true", help="tiny stand-ins: checks the script")
    args = p.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    profile = "tiny" if args.tiny else "faithful"
    path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "MODEL_SOURCE": "standin",
           "STANDIN_PROFILE": profile, "EMBED_CACHE_SIZE": "0",
           "FAISS_INDEX_PATH": str(out / "data" / "faiss_index.bin"), "DOCUMENTS_DIR": str(out / "data" / "documents")}
    for name, argv_ in (("standins", ["builders.standins", "--profile", profile, "--quiet"]),
                        ("data", ["builders.data", "build", "--out", str(out / "data"), "--kind", "support",
                                  "--docs", str(args.docs), "--force", "--no-progress"])):
        with open(out / f"{name}.log", "w") as log:
            done = subprocess.run([sys.executable, "-m", *argv_], cwd=ROOT, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=max(1.0, deadline - time.monotonic()))
        if done.returncode:
            print(f"[invariance_check] {name} failed: see {out / (name + '.log')}", flush=True)
            return 1
    found: dict[str, dict] = {}
    ok = True
    for precision in args.precisions.split(","):
        with open(out / f"cluster-{precision}.log", "w") as log:
            nodes, ports = local_cluster.start({**env, "PRECISION": precision}, out / f"nodes-{precision}", log)
        url = f"http://127.0.0.1:{ports[0]}"
        try:
            wait_healthy(url, min(600.0, deadline - time.monotonic()))
            for mode in MODES:
                left = deadline - time.monotonic()
                result = compare(url, *bodies(args.targets, mode), timeout=max(1.0, left))
                found[f"{precision}/{mode}"] = result
                ok &= not result["differ"]
                verdict = "equal" if not result["differ"] else f"DIFFER: {result['differ']}"
                print(f"[invariance_check] PRECISION={precision} {mode}: {result['targets']} replies alone and among "
                      f"{result['in_flight'] - 1} others: {verdict}", flush=True)
        except (requests.RequestException, TimeoutError) as exc:
            ok = False
            print(f"[invariance_check] PRECISION={precision}: {exc}", flush=True)
        finally:
            local_cluster.stop(nodes)
    (out / "invariance_check.json").write_text(json.dumps({"stand_ins": profile, "results": found}, indent=1) + "\n")
    print(f"[invariance_check] {'every reply equal' if ok else 'NOT invariant'}; details in {out}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
