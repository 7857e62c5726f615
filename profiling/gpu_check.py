"""The GPU check (issue 30): decode steps and a 3-node cluster with faithful stand-ins, one table.

    python -m profiling.gpu_check [--precisions auto] [--budget-s 450] [--phases LIST] [--out DIR] [--results F] [--mps]

Builds the stand-ins and the support corpus, runs the test cases that need CUDA (CUDA_TESTS; their outcomes by test
id), then per precision: `profiling.bench_decode` at 1, 8 and 32 sequences (with the CUDA graphs
its engine recorded: "-" where it decodes eagerly), a local 3-node cluster (the launcher's command line) driven by
`profiling.loadgen`: one request at a time (the idle request's median latency), then closed loops of 8 and 32
clients, then one at a time again (idle once every stage has run under load), and in each phase each node's stages
from its /metrics (items, mean batch, run time a batch and an item, each item's wait from submit to its batch: queue
and batch formation); then each batched stage's batch of one timed in-process (`profiling.microbench`), beside what
the same batch took in the cluster alone; last, three decode steps at 32 sequences profiled (the device's kernels
with the host's ops: the top operators kept, the chrome trace saved beside the results); then the service's own
overhead at 32 clients on this host (`profiling.overhead_floor`: null models) beside each precision's request there.
Every tool runs as a subprocess through its command line, with this interpreter (a GPU machine's torch, not .venv's);
with `--mps` each is a client of NVIDIA's MPS daemon (the workers' kernels side by side on the one GPU). Phases
past --budget-s are skipped and shown as "-" (a cluster's load phases done before are kept); `--phases` runs some
(PHASES: the tests in one call, the cluster in the next). `--tiny`: tiny stand-ins on the CPU, the script's check.

The results (device, torch, commit, the figures, each phase's breakdown, the stages in-process, the engine's top
operators, the overhead floor, each CUDA test's outcome) go to --results as JSON: by default docs/gpu-check.json,
committed beside docs/performance.md, whose claims about CUDA cite it (with --tiny, into --out); the traces beside
it (`<results>-trace-<precision>.json.gz`).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

from profiling.lib import cuda_mps, local_cluster, py_spy
from profiling.lib.gpu_check_report import SEQUENCES, breakdown_table, engine_lines, floor_line, gil_lines, table
from profiling.lib.gpu_check_results import (
    decode_report,
    junit_outcomes,
    microbench_ms,
    results,
    save_traces,
    stage_breakdown,
)
from profiling.lib.provenance import git_commit

ROOT = local_cluster.ROOT
PROFILE_TOP = 25  # the engine's operators kept, by self host time
RESULTS = ROOT / "docs" / "gpu-check.json"
# The stages whose cluster batch is one call of the batch function microbench times (generate's is an engine
# iteration; search's in the cluster is node 2's HTTP call, in-process the index itself).
IN_PROCESS_STAGES = ("embed", "search", "fetch", "rerank", "sentiment", "toxicity")
# The test modules with CUDA cases, and the expression that picks those cases (their ids name cuda).
CUDA_TESTS = [f"tests/unit/test_{name}.py" for name in ("batch_invariance", "precision", "chunked_attention", "decode_floor",
                                                        "cuda_streams", "cuda_attention")] + ["-k", "cuda"]


# The check's phases in the order they run: the CUDA tests, then per precision the decode steps, the cluster, the
# stages in-process and the engine's profile; last the service's own overhead with null models on this host.
PHASES = ("tests", "steps", "cluster", "in_process", "profile", "floor")


class OverBudget(Exception):
    """The check's time is spent: the phase is skipped."""


class Check:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.deadline = time.monotonic() + args.budget_s
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        profile = "tiny" if args.tiny else "faithful"
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # the caller's kept
        self.env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "MODEL_SOURCE": "standin",
                    "STANDIN_PROFILE": profile, "FAISS_INDEX_PATH": str(self.out / "data" / "faiss_index.bin"),
                    "DOCUMENTS_DIR": str(self.out / "data" / "documents")}

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left < 5:
            raise OverBudget()
        return left

    def run(self, name: str, argv: list[str], env: dict | None = None) -> None:
        """`python -m argv...`, its output in OUT/name.log; raises where it fails or outlives the budget."""
        timeout = self.left()
        with open(self.out / f"{name}.log", "w") as log:
            print(f"[gpu_check] {name}: python -m {' '.join(argv)}", flush=True)
            done = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=env or self.env, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=timeout)
        if done.returncode:
            raise RuntimeError(f"{name} exited {done.returncode}: see {self.out / (name + '.log')}")

    def prepare(self) -> None:
        self.run("standins", ["builders.standins", "--profile", self.env["STANDIN_PROFILE"], "--quiet"])
        docs = "100" if self.args.tiny else "2000"
        self.run("data", ["builders.data", "build", "--out", str(self.out / "data"), "--kind", "support",
                          "--docs", docs, "--force", "--no-progress"])

    def cuda_tests(self) -> dict[str, str]:
        """Each CUDA test case's outcome (passed, failed, error or skipped, with the skip's reason), by test id."""
        report = self.out / "cuda-tests.xml"
        argv = ["pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *CUDA_TESTS]
        try:
            self.run("cuda-tests", argv)
        except RuntimeError:
            pass  # a failed case is an outcome, read from the report; no report is a failure of the run
        if not report.exists():
            raise RuntimeError(f"the CUDA tests wrote no report: see {self.out / 'cuda-tests.log'}")
        return junit_outcomes(report.read_text())

    def decode_steps(self, precision: str) -> dict[str, Any]:
        """Median decode step (ms) and the CUDA graphs recorded (None: not on CUDA) at each of SEQUENCES
        running sequences."""
        folder = self.out / f"bench_decode-{precision}"
        self.run(f"bench_decode-{precision}", ["profiling.bench_decode", "--sequences", ",".join(map(str, SEQUENCES)),
                                               "--repeat", "3" if self.args.tiny else "8", "--out", str(folder)],
                 {**self.env, "PRECISION": precision})
        rows = {row["sequences"]: row for row in decode_report(folder)["rows"]}
        return {"steps": [rows[n]["step_ms"] for n in SEQUENCES], "graphs": [rows[n]["cuda_graphs"] for n in SEQUENCES]}

    def stages_in_process(self, precision: str) -> dict[str, Any]:
        """Each of IN_PROCESS_STAGES' median ms for a batch of one, timed in-process on the device the workers use
        with the threads the launcher gives each worker: what the idle request's batches cost without the service
        around them."""
        from tools.local import pinned_env
        folder = self.out / f"microbench-{precision}"
        self.run(f"microbench-{precision}", ["profiling.microbench", "--stage", ",".join(IN_PROCESS_STAGES),
                                             "--batch-sizes", "1", "--repeat", "5", "--warmup", "2", "--no-progress",
                                             # the documents the cluster serves, for rerank's pairs
                                             "--documents", self.env["DOCUMENTS_DIR"], "--out", str(folder)],
                 pinned_env({**self.env, "PRECISION": precision}))
        return {"in_process_ms": microbench_ms(folder)}

    def engine_profile(self, precision: str) -> dict[str, Any]:
        """The top operators (host and device ms) of a few profiled decode steps at the most sequences, and their
        chrome trace's file: a phase of its own, after the others, so a profiler that fails on a device loses
        nothing else."""
        folder, n = self.out / f"bench_decode-profile-{precision}", SEQUENCES[-1]
        self.run(f"bench_decode-profile-{precision}", ["profiling.bench_decode", "--sequences", str(n), "--repeat", "1",
                                                       "--profile", "--profile-steps", "3", "--top", str(PROFILE_TOP),
                                                       "--out", str(folder)], {**self.env, "PRECISION": precision})
        (profile,) = decode_report(folder)["profiles"][str(n)]  # the current kernels' only (no baselines asked)
        return {"engine_profile": {"sequences": n, "steps": profile["steps"], "top_ops": profile["top_ops"]},
                "trace_file": str(folder / profile["trace"])}

    def cluster(self, precision: str, found: dict[str, Any]) -> None:
        """Into `found` as each load phase ends (a budget spent midway keeps the phases before): idle request
        latency (s) right after start and after the loads, the throughput (requests/min) at 8 and 32 clients, and
        each phase's stages."""
        env = {**self.env, "PRECISION": precision}
        with open(self.out / f"cluster-{precision}.log", "w") as log:
            print(f"[gpu_check] cluster-{precision}: python -m {local_cluster.LAUNCHER}", flush=True)
            nodes, ports = local_cluster.start(env, self.out / f"nodes-{precision}", log)
        try:
            small = self.args.tiny
            # idle: the first requests after start; idle_warm: the same once the loads have run every stage
            for name, clients, count in (("idle", 1, 3), ("c8", 8, 16 if small else 64), ("c32", 32, 32 if small else 160),
                                         ("idle_warm", 1, 3)):
                loadgen = ["profiling.loadgen", "--url", f"http://127.0.0.1:{ports[0]}", "--concurrency", str(clients),
                           "--count", str(count), "--duration", str(min(60.0, self.left() - 5)), "--no-plots",
                           "--wait-health", str(min(300.0, self.left() - 5)), "--max-duration", str(self.left()),
                           "--out", str(self.out / f"loadgen-{precision}"), "--name", name]
                # --spy: node 1's GIL through the 32 clients (py-spy, where it is on PATH)
                spy = self.args.spy and name == "c32"
                with py_spy.gil_recording(py_spy.node_pid(nodes.pid, 1) if spy else None,
                                          self.out / f"spy-{precision}-{name}.txt") as recorded:
                    self.run(f"loadgen-{precision}-{name}", loadgen, env)
                if tops := py_spy.read_tops(recorded):
                    found[f"{name}_gil"] = tops
                summary = json.loads((self.out / f"loadgen-{precision}" / f"loadgen_{name}.json").read_text())
                overall = summary["overall"]
                found[name] = overall["latency"]["p50_s"] if clients == 1 else overall["throughput_rpm"]
                if clients > 1:
                    found[f"{name}_p50_s"] = overall["latency"]["p50_s"]
                found[f"{name}_stages"] = stage_breakdown(summary)
        finally:
            local_cluster.stop(nodes)


    def overhead_floor(self) -> dict[str, Any]:
        """The service's own overhead on this host (`profiling.overhead_floor`: null models, the same three nodes)
        at 32 clients: requests a minute, p50 latency and the nodes' CPU a request."""
        folder = self.out / "overhead_floor"
        sizes = ["--clients", "4", "--requests-per-client", "1", "--min-requests", "4", "--level-s", "30"] \
            if self.args.tiny else ["--clients", "32", "--requests-per-client", "5", "--level-s", "60"]
        self.run("overhead_floor", ["profiling.overhead_floor", *sizes, "--docs", "200" if self.args.tiny else "2000",
                                    "--out", str(folder)])
        (level,) = json.loads((folder / "overhead_floor.json").read_text())["results"]["here"]["levels"]
        return {"clients": level["clients"], "requests_per_minute": level["requests_per_minute"],
                "p50_ms": level["latency_ms"]["p50"], "ok": level["ok"], "sent": level["sent"],
                "cpu_ms": level["components_ms"].get("nodes: CPU ms per request")}


def device_line() -> str:
    probe = ("import torch; print('torch', torch.__version__, '|', torch.cuda.get_device_name(0) "
             "if torch.cuda.is_available() else 'no CUDA: the CPU')")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m profiling.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--precisions", default="auto",
                   help="PRECISION values, comma-separated, one row each (CUDA is offered bfloat16 = auto and float16)")
    p.add_argument("--budget-s", type=float, default=450.0, help="phases past this many seconds are skipped")
    p.add_argument("--out", default=str(ROOT / "runs" / time.strftime("gpu_check-%Y%m%dT%H%M%SZ", time.gmtime())))
    p.add_argument("--tiny", action="store_true", help="tiny stand-ins on the CPU, a few requests: checks the script")
    p.add_argument("--mps", action="store_true", help="every process the check starts a client of NVIDIA's MPS daemon")
    p.add_argument("--spy", action="store_true", help="py-spy's GIL samples of node 1 through the 32 clients (a diagnosis)")
    p.add_argument("--results", default=None,
                   help=f"the results file (JSON); default {RESULTS.relative_to(ROOT)}, with --tiny OUT/gpu-check.json")
    p.add_argument("--phases", default=",".join(PHASES),
                   help=f"the phases run, comma-separated (default all: {','.join(PHASES)}); "
                        "the stand-ins and the corpus are always built")
    args = p.parse_args(argv)
    phases = args.phases.split(",")
    if unknown := sorted(set(phases) - set(PHASES)):
        p.error(f"--phases: unknown {', '.join(unknown)}; expected some of {', '.join(PHASES)}")
    check = Check(args)
    rows: dict[str, dict] = {precision: {} for precision in args.precisions.split(",")}
    tests: dict[str, str] | None = None
    floor: dict[str, Any] | None = None
    failed = False
    phases_failed: list[str] = []

    def attempt(label: str, phase: Callable[[], Any]) -> Any:
        """`phase()`, or None where it failed: said, and the check fails (the phases after it still run)."""
        try:
            return phase()
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            phases_failed.append(label)
            print(f"[gpu_check] {label}: {exc}", flush=True)
            return None

    with contextlib.ExitStack() as stack:
        try:
            if args.mps:  # stopped once every phase is done
                stack.enter_context(cuda_mps.daemon(check.env, check.out / "mps"))
            check.prepare()
            if "tests" in phases:
                tests = attempt("CUDA tests", check.cuda_tests)
            for precision, row in rows.items():
                for key, phase in (("steps", check.decode_steps), ("cluster", partial(check.cluster, found=row)),
                                   ("in_process", check.stages_in_process), ("profile", check.engine_profile)):
                    if key in phases:
                        row.update(attempt(f"{precision} {key}", partial(phase, precision)) or {})
            if "floor" in phases:
                floor = attempt("floor", check.overhead_floor)
        except OverBudget:
            failed = True
            print(f"[gpu_check] the {args.budget_s:.0f} s budget is spent: the rest is skipped", flush=True)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            failed = True
            print(f"[gpu_check] preparing: {exc}", flush=True)
    failed = failed or bool(phases_failed) or any(v in ("failed", "error") for v in (tests or {}).values())
    device = device_line()
    print(f"\n{device}; {check.env['STANDIN_PROFILE']} stand-ins; logs and reports in {check.out}\n")
    print(table(rows))
    print("\none request alone, the first after start, beside each stage in-process:\n" + breakdown_table(rows, "idle"))
    print("\none request alone after the loads:\n" + breakdown_table(rows, "idle_warm"))
    print("\nunder 32 clients:\n" + breakdown_table(rows) + "\n" + engine_lines(rows) + gil_lines(rows))
    print("\n" + floor_line(rows, floor))
    path = Path(args.results) if args.results else (check.out / "gpu-check.json" if args.tiny else RESULTS)
    save_traces(rows, path)
    code = git_commit()  # the check's own code: HEAD, and whether the tree differed from it
    commit = code["commit"] + ("+changes" if code["dirty"] else "")
    found = results(rows, tests, device=device, commit=commit, profile=check.env["STANDIN_PROFILE"], failed=failed,
                    floor=floor)
    path.write_text(json.dumps(found, indent=1) + "\n")
    print(f"results: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
