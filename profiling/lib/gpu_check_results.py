"""What profiling.gpu_check reads from the tools it runs (microbench's CSVs, bench_decode's report, loadgen's
/metrics deltas, pytest's JUnit XML) and what it writes: the results file and the engine's traces beside it."""
from __future__ import annotations

import csv
import gzip
import json
import shutil
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any


def microbench_ms(folder: Path) -> dict[str, float]:
    """{stage: median ms of a batch of one} from the microbench_<stage>.csv files microbench wrote into `folder`."""
    found = {}
    for path in sorted(folder.glob("microbench_*.csv")):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["batch_size"] == "1" and row["kernels"] == "current":
                    found[row["stage"]] = round(1000 * float(row["batch_s_median"]), 2)
    return found


def decode_report(folder: Path) -> dict:
    """The report bench_decode wrote into `folder` for the one precision it ran (bench_decode_<precision>.json),
    not its floor table (bench_decode_floor.json, which the same pattern matches)."""
    (report,) = [path for path in folder.glob("bench_decode_*.json") if path.name != "bench_decode_floor.json"]
    return json.loads(report.read_text())


def stage_breakdown(summary: dict) -> list[dict]:
    """Each node's active stages over a loadgen phase (its /metrics deltas): items, mean batch, ms a batch runs,
    the stage's run ms per item (its batches' run over their items) and each item's wait from submit to its batch
    (queue and batch formation), ms; generate's also its decode steps, the engine's ms a step, sequences a step."""
    def ms(value: float | None) -> float | None:
        return None if value is None or value != value else round(1000 * value, 2)  # NaN: no batch to divide by
    rows = []
    for node in summary.get("nodes", []):
        for stage in node.get("stages", []):
            if stage["batches"]:
                run_s = stage["mean_batch_run_s"]
                per_item = None if run_s is None or not stage["items"] else run_s * stage["batches"] / stage["items"]
                rows.append({"node": node["url"], "stage": stage["stage"], "items": stage["items"],
                             "mean_batch": None if stage["mean_batch_size"] is None else round(stage["mean_batch_size"], 2),
                             "run_ms_per_batch": ms(run_s), "run_ms_per_item": ms(per_item),
                             "wait_ms_per_item": ms(stage["mean_item_wait_s"])})
                if steps := stage.get("decode_steps"):  # generate: the engine's time a step (prefills included)
                    rows[-1].update(decode_steps=steps, engine_ms_per_step=ms(run_s * stage["batches"] / steps),
                                    sequences_per_step=round((stage.get("step_sequences") or 0.0) / steps, 2))
    return rows


def save_traces(rows: dict[str, dict], results: Path) -> None:
    """Each precision's engine trace gzipped beside the results file (`<results>-trace-<precision>.json.gz`: a
    tenth of the size; Perfetto opens it as is), the row naming the copy instead of the run's folder."""
    for precision, row in rows.items():
        source = row.pop("trace_file", None)
        if source and Path(source).exists():
            target = results.with_name(f"{results.stem}-trace-{precision}.json.gz")
            with open(source, "rb") as trace, gzip.open(target, "wb") as packed:
                shutil.copyfileobj(trace, packed)
            row["engine_profile"]["trace"] = target.name


def junit_outcomes(xml: str) -> dict[str, str]:
    """'path::name' -> passed / failed / error / 'skipped: reason', from pytest's JUnit XML."""
    outcomes = {}
    for case in ElementTree.fromstring(xml).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = f"{module}.py::{case.get('name')}"
        found = {child.tag: child for child in case}
        if "failure" in found:
            outcomes[name] = "failed"
        elif "error" in found:
            outcomes[name] = "error"
        elif "skipped" in found:
            outcomes[name] = f"skipped: {found['skipped'].get('message', '')}"
        else:
            outcomes[name] = "passed"
    return outcomes


def results(rows: dict[str, dict], tests: dict[str, str] | None, *, device: str, commit: str, profile: str,
            failed: bool, floor: dict[str, Any] | None = None) -> dict:
    """What the check found, as the results file holds it."""
    return {"device": device, "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "stand_ins": profile, "failed": failed, "precisions": rows, "floor": floor, "cuda_tests": tests,
            "cuda_tests_passed": None if tests is None else sum(v == "passed" for v in tests.values()),
            "cuda_tests_failed": None if tests is None else sorted(k for k, v in tests.items()
                                                                   if v in ("failed", "error"))}
