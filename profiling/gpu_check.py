"""The GPU check (issue 30): decode steps and a 3-node cluster with faithful stand-ins, one table.

    python -m profiling.gpu_check [--precisions auto] [--budget-s 450] [--out DIR] [--tiny]

Builds the stand-ins and the support corpus, then per precision: `profiling.bench_decode` at 1, 8 and
32 sequences (with the CUDA graphs its engine recorded: "-" where it decodes eagerly), and a local 3-node cluster (the launcher's command line) driven by `profiling.loadgen`:
one request at a time (the idle request's median latency), then closed loops of 8 and 32 clients.
Every tool runs as a subprocess through its command line, with this interpreter (a GPU machine's
torch, not .venv's). Phases past --budget-s (default: under 8 minutes in all) are skipped and shown
as "-". `--tiny`: tiny stand-ins and a small corpus on the CPU, a few requests: the script's own check.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = "tools.local"  # the local launcher (./run.sh local), run by its command line
SEQUENCES = (1, 8, 32)


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

    def decode_steps(self, precision: str) -> dict[str, list]:
        """Median decode step (ms) and the CUDA graphs recorded (None: not on CUDA) at each of SEQUENCES
        running sequences."""
        folder = self.out / f"bench_decode-{precision}"
        self.run(f"bench_decode-{precision}", ["profiling.bench_decode", "--sequences", ",".join(map(str, SEQUENCES)),
                                               "--repeat", "3" if self.args.tiny else "8", "--out", str(folder)],
                 {**self.env, "PRECISION": precision})
        report = json.loads(next(folder.glob("bench_decode_*.json")).read_text())
        rows = {row["sequences"]: row for row in report["rows"]}
        return {"steps": [rows[n]["step_ms"] for n in SEQUENCES], "graphs": [rows[n]["cuda_graphs"] for n in SEQUENCES]}

    def cluster(self, precision: str) -> dict[str, float]:
        """Idle request latency (s) and the throughput (requests/min) at 8 and 32 clients."""
        ports = free_ports(3)
        env = {**self.env, "PRECISION": precision, **{f"NODE_{n}_IP": f"127.0.0.1:{p}" for n, p in enumerate(ports)}}
        with open(self.out / f"cluster-{precision}.log", "w") as log:
            print(f"[gpu_check] cluster-{precision}: python -m {LAUNCHER}", flush=True)
            nodes = subprocess.Popen([sys.executable, "-m", LAUNCHER, "--log-dir", str(self.out / f"nodes-{precision}")],
                                     cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            found = {}
            small = self.args.tiny
            for name, clients, count in (("idle", 1, 3), ("c8", 8, 16 if small else 64), ("c32", 32, 32 if small else 160)):
                loadgen = ["profiling.loadgen", "--url", f"http://127.0.0.1:{ports[0]}", "--concurrency", str(clients),
                           "--count", str(count), "--duration", str(min(60.0, self.left() - 5)), "--no-plots",
                           "--wait-health", str(min(300.0, self.left() - 5)), "--max-duration", str(self.left()),
                           "--out", str(self.out / f"loadgen-{precision}"), "--name", name]
                self.run(f"loadgen-{precision}-{name}", loadgen, env)
                summary = json.loads((self.out / f"loadgen-{precision}" / f"loadgen_{name}.json").read_text())
                overall = summary["overall"]
                found[name] = overall["latency"]["p50_s"] if name == "idle" else overall["throughput_rpm"]
            return found
        finally:
            stop(nodes)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM (the launcher stops its nodes gracefully), then SIGKILL to the group past a minute."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def cell(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def table(rows: dict[str, dict]) -> str:
    lines = ["| | idle request | concurrency 8 | concurrency 32 | decode step, 1 / 8 / 32 sequences | CUDA graphs |",
             "|---|---|---|---|---|---|"]
    for precision, r in rows.items():
        steps = " / ".join(cell(s, ".1f") for s in r.get("steps") or [None] * len(SEQUENCES))
        graphs = " / ".join(cell(g, "d") for g in r.get("graphs") or [None] * len(SEQUENCES))
        lines.append(f"| {precision} | {cell(r.get('idle'), '.2f')} s | {cell(r.get('c8'), '.1f')} req/min | "
                     f"{cell(r.get('c32'), '.1f')} req/min | {steps} ms | {graphs} |")
    return "\n".join(lines)


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
    args = p.parse_args(argv)
    check = Check(args)
    rows: dict[str, dict] = {precision: {} for precision in args.precisions.split(",")}
    failed = False
    try:
        check.prepare()
        for precision, row in rows.items():
            for key, phase in (("steps", check.decode_steps), ("cluster", check.cluster)):
                try:
                    row.update(phase(precision))
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    failed = True
                    print(f"[gpu_check] {precision} {key}: {exc}", flush=True)
    except OverBudget:
        failed = True
        print(f"[gpu_check] the {args.budget_s:.0f} s budget is spent: the rest is skipped", flush=True)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        failed = True
        print(f"[gpu_check] preparing: {exc}", flush=True)
    print(f"\n{device_line()}; {check.env['STANDIN_PROFILE']} stand-ins; logs and reports in {check.out}\n")
    print(table(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
