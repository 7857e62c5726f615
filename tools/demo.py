"""`./run.sh demo`: the three nodes on 127.0.0.1 answering the client's eight queries."""
from __future__ import annotations

import argparse
import logging
import os
import sys

import client  # the top-level client.py, exactly as a user runs it
from pipeline.config import REPO_ROOT, ConfigError, Settings
from tools.local import LocalCluster, pinned_env

# What PRECISION=fast gives and changes, measured (docs/performance.md section 7: AMX Xeon, faithful stand-ins).
FAST_HINT = ("PRECISION=fast (opt-in): 1.6x the throughput at 8 concurrent requests and about half the idle "
             "latency, measured on an AMX Xeon; the LLM then computes in int8, whose answers drift from "
             "float32 about four times as much as bfloat16's (docs/performance.md section 7)")


def precision_hint(settings: Settings) -> str | None:
    """The one line the demo prints about PRECISION=fast, unless it is already in use."""
    return None if settings.models.precision == "fast" else FAST_HINT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--interval-s", type=float, default=0.5, help="seconds between the client's queries")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s demo %(levelname)s: %(message)s")
    try:
        cluster = LocalCluster(pinned_env(os.environ), REPO_ROOT / "logs" / "demo")  # the nodes' environment
        hint = precision_hint(Settings.from_env(os.environ))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    logging.info("starting the three nodes (logs in %s)", cluster.log_dir)
    if hint:
        logging.info(hint)
    try:
        cluster.start()
        return client.main(["--url", cluster.url(0), "--interval", str(args.interval_s)])
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
