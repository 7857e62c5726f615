"""Issue 52's service protocol on this machine, each figure beside this machine's own floor for the same request.

    python -m profiling.service_protocol --data DIR [--precisions auto,fast] [--layouts 2x1,1x2] [--rounds 2]
                                         [--idle-count 3] [--concurrency 8] [--count 24] [--out DIR]

--data is a data build (the issue's: ``python -m builders.data build --kind course --docs 200000 --nlist 4096
--nprobe 64 --accept-low-recall --out DIR``). For each round, each --precisions value and each --layouts entry
(WORKERSxTHREADS: ``2x1`` is the shape's three nodes with a torch thread a worker, what ``./run.sh local`` gives two
workers on two cores; ``1x2`` one worker holding both cores, an index node beside it), in turn: a fresh local cluster
on 127.0.0.1 (caches off), one warm-up request, --idle-count requests one at a time, then --count requests from
--concurrency closed-loop clients; the queries are `profiling.lib.inputs.query_set`'s (none repeats within a phase).

The floor is profiling.roofline's counts for the same request (the documents from --data's documents.db, the
precision's stage variants, this CPU's peaks and read bandwidth measured first). An idle request's: its stages one
after another (each its arithmetic or its bytes, whichever takes longer), on one worker's threads. --concurrency
requests': every stage's arithmetic at the peaks of all the layout's threads (at most the cores) and every byte at
their read bandwidth, each worker streaming its own copy of the weights, the two overlapped (while one worker's
rerank computes, another's decode reads): the machine's bound, which no run passes at the bandwidth measured (a
shared host's moves). Each row prints the idle p50 over its floor (1 or more) and the requests a minute as a share
of the floor's (1 or less). Writes service_protocol.json into --out (default: a fresh runs/service_protocol-<UTC
time>/). Run it alone: the machine's spare cores are part of what it measures.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from pipeline import spec
from pipeline.config import ConfigError, Settings
from profiling.lib import local_cluster
from profiling.lib import roofline as roof
from profiling.lib.cli import add_out, comma_list, make_parser, positive
from profiling.lib.inputs import query_set
from profiling.lib.load import ClosedGroup, LoadTarget, run_closed
from profiling.lib.machine_peaks import Machine, measure_machine
from profiling.lib.provenance import local_record
from profiling.lib.report import run_folder, run_stats, text_table, write_json

TOOL = "service_protocol"
STARTUP_S = 600.0  # faithful stand-ins load in about half a minute a worker on two cores
REQUEST_TIMEOUT_S = 300.0


@dataclasses.dataclass(frozen=True)
class Layout:
    workers: int
    threads: int  # TORCH_THREADS of each worker

    @classmethod
    def parse(cls, text: str) -> Layout:
        workers, _, threads = text.partition("x")
        if not (workers.isdigit() and threads.isdigit() and int(workers) >= 1 and int(threads) >= 1):
            raise ValueError(f"a layout is WORKERSxTHREADS with both 1 or more (2x1, 1x2), not {text!r}")
        return cls(int(workers), int(threads))

    def __str__(self) -> str:
        return f"{self.workers}x{self.threads}"


def parser():
    p = make_parser(f"python -m profiling.{TOOL}", __doc__)
    p.add_argument("--data", type=Path, required=True, help="a data build's folder (faiss_index.bin, documents/)")
    p.add_argument("--precisions", type=comma_list(str, what="PRECISION values", example="auto,fast"),
                   default=["auto", "fast"], help="PRECISION values, one cluster each")
    p.add_argument("--layouts", type=comma_list(Layout.parse, what="layouts", example="2x1,1x2"),
                   default=[Layout(2, 1)], help="WORKERSxTHREADS, one cluster each")
    p.add_argument("--rounds", type=positive(int), default=1, help="every configuration once a round, in turn")
    p.add_argument("--idle-count", type=positive(int), default=3, help="requests one at a time")
    p.add_argument("--concurrency", type=positive(int), default=8, help="closed-loop clients")
    p.add_argument("--count", type=positive(int), default=24, help="requests at --concurrency")
    p.add_argument("--phase-s", type=positive(float), default=600.0, help="no new request after this long a phase")
    p.add_argument("--matmul-size", type=positive(int), default=2048, help="n of the floor's n x n x n matmuls timed")
    p.add_argument("--bandwidth-mib", type=positive(int), default=1024, help="MiB of the floor's bandwidth read")
    add_out(p, TOOL)
    return p


def plan_name(precision: str) -> str:
    """The roofline plan a PRECISION value runs: auto's variant on this CPU, fast's table, or the variant named."""
    if precision == "auto":
        from pipeline.cpu_features import cpu_supports_bf16
        from pipeline.precision_policy import auto_variant
        return auto_variant("cpu", bf16_cpu=cpu_supports_bf16)
    return precision


def floors(settings: Settings, args) -> dict[str, Any]:
    """Per precision and layout: the idle request's floor (s) and `concurrency` requests' (requests a minute), as
    the module's docstring says, with the machine read at each thread count they need."""
    from builders.standins import source_building_standins
    from profiling import roofline
    source = source_building_standins(settings)
    models = roofline.load_models(source)
    tokens, counted = roofline.request_tokens(source, 0, spec.MAX_NEW_TOKENS, documents_dir=args.data / "documents")
    cores = os.cpu_count() or 1
    counts = sorted({min(n, cores) for layout in args.layouts for n in (layout.threads, layout.workers * layout.threads)})
    machines = {n: measure_machine(n, args.matmul_size, args.bandwidth_mib, rounds=5, warmup=1) for n in counts}
    plans = roofline.stage_plans()

    def plan(precision: str, machine: Machine, requests: int) -> roof.PlanFloor:
        return roof.plan_floor(plan_name(precision), plans[plan_name(precision)], models, tokens, machine, requests)

    def layout_floor(precision: str, layout: Layout) -> dict[str, float]:
        together = plan(precision, layout_machine(machines, cores, layout), args.concurrency).concurrent.values()
        bound_s = max(sum(f.compute_s for f in together), sum(f.memory_s for f in together))
        return {"idle_s": plan(precision, machines[min(layout.threads, cores)], 1).idle_s,
                "concurrent_rpm": 60.0 * args.concurrency / bound_s}
    table = {precision: {str(layout): layout_floor(precision, layout) for layout in args.layouts}
             for precision in args.precisions}
    return {"floors": table, "tokens": tokens, "counted": counted,
            "machines": {str(n): machine for n, machine in machines.items()}}


def layout_machine(machines: dict[int, Machine], cores: int, layout: Layout) -> Machine:
    """This machine as the layout's workers use it together: the peaks of all their threads (at most the cores), and
    the read bandwidth there divided among the copies of the weights they stream (one a worker)."""
    machine = machines[min(layout.workers * layout.threads, cores)]
    return dataclasses.replace(machine, read_bandwidth=machine.read_bandwidth / layout.workers,
                               copy_bandwidth=machine.copy_bandwidth / layout.workers)


@contextlib.contextmanager
def cluster(env: dict[str, str], layout: Layout, log_dir: Path) -> Iterator[str]:
    """A local cluster of `layout` on free ports; yields node 0's URL once every worker is up."""
    env = {**env, "LOCAL_WORKERS": str(layout.workers), "TORCH_THREADS": str(layout.threads)}
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "launcher.log", "w") as log:
        process, ports = local_cluster.start(env, log_dir, log)
    url = f"http://127.0.0.1:{ports[0]}"
    try:
        local_cluster.wait_ready(url, process, STARTUP_S, str(log_dir))
        yield url
    finally:
        local_cluster.stop(process)


def phase(url: str, name: str, queries: list[str], count: int, clients: int, limit_s: float) -> dict[str, Any]:
    target = LoadTarget(url, queries, REQUEST_TIMEOUT_S, time.monotonic() + limit_s + REQUEST_TIMEOUT_S,
                        id_prefix=name)
    stats = run_stats(name, count, run_closed(target, ClosedGroup(name, count, clients, limit_s)))
    return {"sent": stats.sent, "ok": stats.ok, "errors": stats.errors, "requests_per_minute": stats.throughput_rpm,
            "p50_s": stats.latency.p50_s, "p95_s": stats.latency.p95_s, "served_by": stats.served_by}


def measure(args, env: dict[str, str], precision: str, layout: Layout, log_dir: Path) -> dict[str, Any]:
    asked = query_set(1 + args.idle_count + args.count)
    run_env = {**env, "PRECISION": precision}
    with cluster(run_env, layout, log_dir) as url:
        phase(url, "warm", asked[:1], 1, 1, args.phase_s)
        idle = phase(url, "idle", asked[1:1 + args.idle_count], args.idle_count, 1, args.phase_s)
        loaded = phase(url, f"c{args.concurrency}", asked[1 + args.idle_count:], args.count, args.concurrency,
                       args.phase_s)
    return {"idle": idle, "loaded": loaded}


def row(result: dict[str, Any], floor: dict[str, float]) -> tuple:
    idle, loaded = result["idle"], result["loaded"]
    return (result["round"], result["precision"], result["layout"], f"{idle['ok']}/{idle['sent']}", idle["p50_s"],
            floor["idle_s"], idle["p50_s"] / floor["idle_s"], f"{loaded['ok']}/{loaded['sent']}",
            loaded["requests_per_minute"], floor["concurrent_rpm"],
            loaded["requests_per_minute"] / floor["concurrent_rpm"])


def main(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> int:
    args = parser().parse_args(argv)
    env = dict(os.environ if env is None else env)
    env.update({"FAISS_INDEX_PATH": str(args.data / "faiss_index.bin"), "DOCUMENTS_DIR": str(args.data / "documents"),
                "EMBED_CACHE_SIZE": "0", "RESPONSE_CACHE_SIZE": "0"})
    try:
        settings = Settings.from_env(env)
        settings.require_index_files()
        settings.require_documents()
        for precision in args.precisions:
            Settings.from_env({**env, "PRECISION": precision})
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = run_folder(TOOL, args.out)
    found = floors(settings, args)
    print(f"[{TOOL}] {found['machines'][max(found['machines'], key=int)].describe()}", flush=True)
    results = []
    for round_number in range(1, args.rounds + 1):
        for precision in args.precisions:
            for layout in args.layouts:
                print(f"[{TOOL}] round {round_number}: PRECISION={precision}, {layout}", flush=True)
                measured = measure(args, env, precision, layout, out / f"nodes-{round_number}-{precision}-{layout}")
                results.append({"round": round_number, "precision": precision, "layout": str(layout), **measured})
    columns = [("round", "<6"), ("precision", "<10"), ("layout", "<6"), ("idle ok", ">8"), ("idle p50 s", ">11.2f"),
               ("floor s", ">8.2f"), ("x floor", ">8.2f"), (f"c{args.concurrency} ok", ">7"), ("req/min", ">8.1f"),
               ("floor", ">7.1f"), ("of floor", ">9.2f")]
    print(text_table(columns, [row(r, found["floors"][r["precision"]][r["layout"]]) for r in results]))
    path = write_json(out / f"{TOOL}.json", {"args": vars(args), "results": results, **found,
                                             "provenance": local_record(settings=settings)})
    print(f"results in {path}")
    return 0 if all(r[k]["ok"] == r[k]["sent"] for r in results for k in ("idle", "loaded")) else 1


if __name__ == "__main__":
    sys.exit(main())
