"""`./run.sh demo`: the three nodes on 127.0.0.1 answering the client's eight queries."""
from __future__ import annotations

import argparse
import logging
import os
import sys

import client  # the top-level client.py, exactly as a user runs it
from pipeline import spec
from pipeline.config import REPO_ROOT, ConfigError, Settings
from pipeline.device import describe_placement, hardware_words, select_device
from pipeline.precision_policy import CPU_AMX, HARDWARE_WORDS
from tools.local import LocalCluster, pinned_env

# What PRECISION=fast gave against PRECISION=auto (bfloat16 there), and where: docs/performance.md
# section 7, faithful stand-ins, commit f8683be. Measured on that one kind of CPU only.
FAST_MEASURED_ON = CPU_AMX
FAST_HINT = ("PRECISION=fast (opt-in): 1.64x the throughput at 8 concurrent requests and about half the idle "
             "latency against PRECISION=auto, measured on a 2-vCPU Intel Xeon with AMX (faithful stand-ins, "
             "commit f8683be, docs/performance.md section 7); the LLM then computes in int8, whose answers "
             "drift from float32 about four times as much as bfloat16's")


def precision_hint(settings: Settings, **detectors) -> str | None:
    """The one line the demo prints about PRECISION=fast, unless it is already in use: the figure,
    where it was measured, and this machine's kind beside it."""
    if settings.models.precision == "fast":
        return None
    here = hardware_words(select_device(settings.models.only_cpu, **{k: v for k, v in detectors.items()
                                                                     if k == "cuda_available"}), **detectors)
    same = here == HARDWARE_WORDS[FAST_MEASURED_ON]
    return f"{FAST_HINT}. This machine: {here}" + ("" if same else ": not measured on this kind of CPU")


def precision_lines(settings: Settings) -> list[str]:
    """What each model stage will compute in on this machine (the nodes resolve it the same way)."""
    return [describe_placement(settings, stage) for stage in spec.MODEL_STAGES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--interval-s", type=float, default=0.5, help="seconds between the client's queries")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s demo %(levelname)s: %(message)s")
    try:
        env = pinned_env(os.environ)  # the nodes' environment
        cluster = LocalCluster(env, REPO_ROOT / "logs" / "demo")
        settings = Settings.from_env(env)
        lines = precision_lines(settings)
        hint = precision_hint(settings)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    logging.info("starting the three nodes (logs in %s)", cluster.log_dir)
    for line in lines:
        logging.info("computes %s", line)
    if hint:
        logging.info(hint)
    try:
        cluster.start()
        return client.main(["--url", cluster.url(0), "--interval", str(args.interval_s)])
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
